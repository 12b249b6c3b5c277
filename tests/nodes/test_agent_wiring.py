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


class _Directory(_Store):
    """The directory's calls an agent makes between attempts, on a dict."""

    def check(self, keys) -> bool:
        return all(k in self.kv for k in keys)

    def get(self, key: str) -> bytes:
        return self.kv[key].encode()

    def add(self, key: str, n: int) -> int:
        self.kv[key] = str(int(self.kv.get(key, "0")) + n)
        return int(self.kv[key])

    def delete_key(self, key: str) -> None:
        self.kv.pop(key, None)


def test_an_agent_that_does_not_see_the_run_directory_refuses_in_one_line(tmp_path):
    import json

    from unbroken.protocol import JOB_ATTEMPTS, JOB_NODES, job_attempt_key, node_error_key

    d = _Directory()
    d.kv[JOB_NODES] = "2"
    d.kv[job_attempt_key(1)] = json.dumps({"port": 1, "out": str(tmp_path / "elsewhere")})
    d.kv[JOB_ATTEMPTS] = "1"
    with pytest.raises(agent_mod.AgentError) as e:
        agent_mod.follow(d, "10.1.2.3", 1, {}, str(tmp_path), ifname=None, connect_timeout=1)
    assert str(e.value).startswith(f"the run directory {tmp_path / 'elsewhere'} is not visible "
                                   f"on this node")
    assert d.kv[node_error_key(1)] == str(e.value)  # the coordinator raises it as its own line


def test_an_agent_past_the_jobs_nodes_leaves_and_frees_its_claim(tmp_path):
    from unbroken.protocol import JOB_NODES, node_key

    d = _Directory()
    d.kv[JOB_NODES] = "2"
    d.kv[node_key(2)] = "{}"
    with pytest.raises(agent_mod.AgentError, match=r"--node 2: the job has 2 nodes \(0\.\.1\)"):
        agent_mod.follow(d, "10.1.2.3", 2, {}, str(tmp_path), ifname=None, connect_timeout=1)
    assert node_key(2) not in d.kv
