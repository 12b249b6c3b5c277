"""core.ranks: a group of ranks' finding and exit status, folded from its ranks' views."""

from unbroken.core.ranks import FINDINGS, group_finding, group_status, lost_status


def test_the_group_finds_the_gravest_kind_any_rank_found():
    assert group_finding([0, 0, 0]) is None
    # two ranks that saw the same NaN are one NaN, not a sum that reads as another kind
    assert group_finding([0, 2, 0]) == "implicit"
    assert group_finding([1, 1, 0]) == "implicit"
    assert group_finding([1, 0, 1]) == "code"
    assert FINDINGS == ("sdc", "implicit", "code")


def test_the_groups_status_is_its_first_failure_a_signal_first():
    assert group_status([None, None]) is None
    assert group_status([0, None]) is None          # one rank done, one runs: still running
    assert group_status([0, 0]) == (0, 0)
    assert group_status([None, 3]) == (1, 3)
    # the rank killed by a signal is the cause; the one that exited on noticing it is not
    assert group_status([11, -9]) == (1, -9)
    assert group_status([-9, -15]) == (0, -9)
    assert group_status([3, 11]) == (0, 3)


def test_a_lost_status_is_a_signal_a_left_out_member_or_a_fenced_group():
    from unbroken.protocol import ExitCode

    assert lost_status(-9) and lost_status(-19)
    assert lost_status(int(ExitCode.JOIN_FAILED)) and lost_status(int(ExitCode.GROUP_FENCED))
    # outcomes the job handles otherwise: an error, a stop, a wipe-out without spares
    assert not any(lost_status(int(c)) for c in (ExitCode.WORKER_ERROR, ExitCode.STOPPED,
                                                   ExitCode.WIPEOUT, ExitCode.COORDINATOR_LOST))
