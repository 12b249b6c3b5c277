"""supervise.rankgroup.fence_reason: the launcher reads why a rank other than 0 fenced its
group from that rank's own journal (which it does not tail)."""

from __future__ import annotations

import json

from unbroken.supervise.rankgroup import fence_reason


def _line(ev: dict) -> str:
    return json.dumps(ev) + "\n"


def test_the_fence_line_is_found_behind_a_long_journal_and_other_groups_are_not_read(tmp_path):
    fence = {"event": "group_fenced", "gen": 3, "rank": 1, "sibling": 0,
             "reason": "rank 0 of the group silent for 0.31 s", "t": 1.0}
    # a journal longer than the tail read: its cut first line must not break the read
    commits = "".join(_line({"event": "commit", "step": k, "pad": "x" * 200})
                      for k in range(100))
    (tmp_path / "rank-2.1.jsonl").write_text(commits + _line(fence))
    (tmp_path / "rank-12.1.jsonl").write_text(_line({**fence, "reason": "another group"}))
    assert fence_reason(tmp_path, 2) == fence
    assert fence_reason(tmp_path, 1) is None  # group 12's file is not group 1's


def test_no_fence_line_no_rank_journal_or_a_torn_last_line_is_none(tmp_path):
    (tmp_path / "rank-4.1.jsonl").write_text(_line({"event": "commit", "step": 0})
                                            + '{"event": "group_fen')
    assert fence_reason(tmp_path, 4) is None
    assert fence_reason(tmp_path, 5) is None
    assert fence_reason(tmp_path / "missing", 4) is None
