"""FSCILProtocol: class bookkeeping and every validation rule."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.data.protocol import FSCILProtocol, Session
from pipeline.errors import FSCILError

# 4 base classes x 3 train images, 2 sessions x 2 ways x 2 shots, 2 test images per class
LABELS = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3,   # 0..11 base train
                   4, 4, 5, 5,                          # 12..15 session 1
                   6, 6, 7, 7,                          # 16..19 session 2
                   *np.repeat(np.arange(8), 2)])        # 20..35 test


def make(**changes) -> FSCILProtocol:
    sessions = changes.pop("sessions", None) or [
        Session(0, [0, 1, 2, 3], np.arange(12)),
        Session(1, [4, 5], np.arange(12, 16)),
        Session(2, [6, 7], np.arange(16, 20)),
    ]
    return FSCILProtocol(sessions, changes.pop("test_ids", np.arange(20, 36)))


def test_class_bookkeeping() -> None:
    p = make()
    p.validate(LABELS, ways=2, shots=2)
    assert (p.num_sessions, p.num_incremental, p.num_classes, p.num_base_classes) == (3, 2, 8, 4)
    assert (p.ways, p.shots) == (2, 2)
    assert p.base_classes.tolist() == [0, 1, 2, 3]
    assert p.seen_classes(0).tolist() == [0, 1, 2, 3]
    assert p.seen_classes(2).tolist() == list(range(8))
    assert p.num_seen(1) == 6
    assert p.novel_classes_upto(0).tolist() == []
    assert p.novel_classes_upto(2).tolist() == [4, 5, 6, 7]
    # evaluation after session 1: the test images of classes 0..5 only
    assert p.test_ids_seen(1, LABELS).tolist() == list(range(20, 32))
    assert p.test_ids_seen(2, LABELS).tolist() == list(range(20, 36))
    assert p.sessions[1].train_ids.dtype == np.int64
    with pytest.raises(FSCILError, match="session 3 out of range 0..2"):
        p.seen_classes(3)


def test_equality_and_uneven_sessions() -> None:
    assert make() == make()
    assert make() != make(test_ids=np.arange(21, 36))
    uneven = make(sessions=[Session(0, [0, 1, 2, 3], np.arange(12)), Session(1, [4, 5, 6], np.arange(12, 18))])
    assert uneven.ways == 3 and uneven.shots == 2
    assert make(sessions=[Session(0, [0], [0]), Session(1, [1], [1]), Session(2, [2, 3], [2, 3, 4])]).ways is None


@pytest.mark.parametrize(("changes", "message"), [
    ({"sessions": [Session(0, [0, 1, 2, 3], np.arange(12)), Session(1, [4, 5], np.arange(12, 16)),
                   Session(2, [5, 7], np.arange(16, 20))]},
     "session 2 classes must be the next contiguous ids 6..7"),
    ({"sessions": [Session(0, [0, 1, 2, 3], np.arange(12)), Session(1, [4, 5], np.arange(12, 16)),
                   Session(2, [6, 7], [15, 16, 18, 19])]},
     "session 2 reuses training sample 15 of an earlier session"),
    ({"sessions": [Session(0, [0, 1, 2, 3], np.arange(12)), Session(1, [4, 5], np.arange(12, 16)),
                   Session(2, [6, 7], [16, 17, 18])]},
     r"session 2 has 1..2 samples per class, expected 2"),
    ({"sessions": [Session(0, [0, 1, 2, 3], np.arange(12)), Session(1, [4, 5], np.arange(12, 16)),
                   Session(2, [6, 7], [16, 17, 18, 20])]},
     "session 2: sample 20 has class 0, not one of the session's classes"),
    ({"sessions": [Session(0, [0, 1, 2, 3], np.arange(12)), Session(1, [4, 5], np.arange(12, 16)),
                   Session(2, [6, 7], [16, 17])]},
     r"session 2: class 7 \('h'\) has no training sample"),
    ({"test_ids": np.arange(20, 34)}, r"class 7 \('h'\) has no test images"),
    ({"test_ids": np.r_[19, np.arange(20, 36)]}, "sample 19 is both a training and a test sample"),
    ({"test_ids": np.r_[20, np.arange(20, 36)]}, "a test sample is listed twice"),
    ({"test_ids": np.arange(20, 37)}, r"test ids outside 0..35"),
])
def test_validate_rejects(changes: dict, message: str) -> None:
    with pytest.raises(FSCILError, match=message):
        make(**changes).validate(LABELS, ways=2, shots=2, class_names=list("abcdefgh"))


def test_validate_rejects_wrong_ways_and_bad_index() -> None:
    with pytest.raises(FSCILError, match="session 1 has 2 classes, expected 3"):
        make().validate(LABELS, ways=3)
    with pytest.raises(FSCILError, match="session at position 1 has index 2"):
        FSCILProtocol([Session(0, [0], [0]), Session(2, [1], [1])])
