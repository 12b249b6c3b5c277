"""What an agent on another machine gives its workers (in-process, no worker started): the
coordinator's address as the agent was given it, and the gloo interface that reaches it."""

from __future__ import annotations

import socket

import pytest

from unbroken.nodes import agent as agent_mod


class _Store:
    def __init__(self) -> None:
        self.kv: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.kv[key] = value


class _Proc:
    pid = 4242


def test_a_worker_is_pointed_at_the_address_its_agent_was_given(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr("unbroken.spawn.start",
                        lambda entry, argv, **kw: started.append((argv, kw["env"])) or _Proc())
    st = _Store()
    a = agent_mod.Agent(st, 2, str(tmp_path), host="10.1.2.3", ifname="ib0")
    a._spawn(7, ["--uid", "7", "--port", "5555", "--journal", str(tmp_path)], None)
    (argv, env), = started
    # the coordinator's argv says nothing of its address (it may be 127.0.0.1 to itself):
    # the agent's own view of it comes last, so it wins
    assert argv[-4:] == ["--node", "2", "--host", "10.1.2.3"]
    assert env["GLOO_SOCKET_IFNAME"] == "ib0"
    assert st.kv["node_pid/7"] == "4242"
    a = agent_mod.Agent(st, 2, str(tmp_path), host="10.1.2.3", ifname=None)
    a._spawn(8, ["--uid", "8"], None)
    assert "GLOO_SOCKET_IFNAME" not in started[-1][1]  # none found: gloo's own choice


def test_the_interface_is_the_one_holding_the_address_that_reaches_the_coordinator(
        monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    assert agent_mod.gloo_ifname("127.0.0.1", 1) == "lo"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.254", 9))
            mine = s.getsockname()[0]
    except OSError:
        pytest.skip("no default route")
    name = agent_mod.gloo_ifname(mine, 1)
    assert name is not None and name != "lo"
    assert (socket.if_nametoindex(name) > 0)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")  # the user's choice wins
    assert agent_mod.gloo_ifname(mine, 1) == "eth7"
