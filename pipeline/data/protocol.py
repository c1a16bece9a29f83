"""The FSCIL protocol: which classes and training samples each session adds, and the test set.

Convention the whole pipeline relies on: class ids are contiguous and session-ordered. The base session
owns classes 0..B-1, session 1 the next `ways` ids, and so on, so "the classes seen after session t" is
always `arange(num_seen(t))`. Readers and generators relabel their sources to guarantee it.

Sample ids index the rows of the image pack (`labels[i]` is the class of sample i).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.errors import FSCILError


def _int64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64).reshape(-1)


@dataclass(frozen=True, eq=False)
class Session:
    """One session: index 0 is the base session, 1..S the incremental ones.

    classes: (C_t,) int64 class ids introduced by this session.
    train_ids: (N_t,) int64 sample ids of its training set.
    """

    index: int
    classes: np.ndarray
    train_ids: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", _int64(self.classes))
        object.__setattr__(self, "train_ids", _int64(self.train_ids))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Session):
            return NotImplemented
        return (self.index == other.index and np.array_equal(self.classes, other.classes)
                and np.array_equal(self.train_ids, other.train_ids))

    __hash__ = None  # arrays are mutable-typed; sessions are compared, not hashed


def _check_session(s, labels: np.ndarray, first_class: int, earlier_ids: set[int], ways: int | None,
                   shots: int | None, name) -> None:
    """One session of `FSCILProtocol.validate`: the next contiguous class ids, training samples within the labels,
    listed once, not an earlier session's, each of the session's classes, every class trained, and an incremental
    session's `ways` x `shots` when given."""
    n, where, ids = len(labels), f"protocol: session {s.index}", s.train_ids
    if len(s.classes) == 0:
        raise FSCILError(f"{where} has no classes")
    want = np.arange(first_class, first_class + len(s.classes))
    if not np.array_equal(np.sort(s.classes), want):
        raise FSCILError(f"{where} classes must be the next contiguous ids {want[0]}..{want[-1]}")
    if len(ids) == 0:
        raise FSCILError(f"{where} has no training samples")
    if ids.min() < 0 or ids.max() >= n:
        raise FSCILError(f"{where} references sample ids outside 0..{n - 1}")
    if len(np.unique(ids)) != len(ids):
        raise FSCILError(f"{where} lists a training sample twice")
    overlap = earlier_ids.intersection(ids.tolist())
    if overlap:
        raise FSCILError(f"{where} reuses training sample {min(overlap)} of an earlier session")
    stray = ~np.isin(labels[ids], s.classes)
    if stray.any():
        i = int(ids[np.argmax(stray)])
        raise FSCILError(f"{where}: sample {i} has class {labels[i]}, not one of the session's classes")
    counts = np.bincount(labels[ids] - s.classes.min(), minlength=len(s.classes))
    if (counts == 0).any():
        raise FSCILError(f"{where}: class {name(int(s.classes.min() + np.argmin(counts)))} has no training sample")
    if s.index > 0:
        if ways is not None and len(s.classes) != ways:
            raise FSCILError(f"{where} has {len(s.classes)} classes, expected {ways}")
        if shots is not None and not (counts == shots).all():
            raise FSCILError(f"{where} has {counts.min()}..{counts.max()} samples per class, expected {shots}")


@dataclass(frozen=True, eq=False)
class FSCILProtocol:
    """Sessions (0 = base) plus the ids of all test samples of all classes.

    sessions: list of Session, sessions[t].index == t.
    test_ids: (M,) int64; evaluation after session t uses the subset whose class was seen by then.
    """

    sessions: list[Session]
    test_ids: np.ndarray = field(default_factory=lambda: _int64([]))

    def __post_init__(self) -> None:
        object.__setattr__(self, "sessions", list(self.sessions))
        object.__setattr__(self, "test_ids", _int64(self.test_ids))
        if not self.sessions:
            raise FSCILError("protocol: needs at least the base session")
        for t, s in enumerate(self.sessions):
            if s.index != t:
                raise FSCILError(f"protocol: session at position {t} has index {s.index}")

    @classmethod
    def from_layout(cls, session_sizes: list[int], session_class_counts: list[int], num_test: int) -> FSCILProtocol:
        """The protocol of a pack laid out session by session: the training samples of session 0, 1, ..., then
        `num_test` test samples; class ids are session-ordered (session t introduces the next
        session_class_counts[t] ids)."""
        bounds = np.cumsum([0, *session_sizes, num_test])
        first = np.cumsum([0, *session_class_counts])
        sessions = [Session(t, np.arange(first[t], first[t + 1]), np.arange(bounds[t], bounds[t + 1]))
                    for t in range(len(session_sizes))]
        return cls(sessions, test_ids=np.arange(bounds[-2], bounds[-1]))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FSCILProtocol):
            return NotImplemented
        return self.sessions == other.sessions and np.array_equal(self.test_ids, other.test_ids)

    __hash__ = None

    # ---- sizes -------------------------------------------------------------------------------------
    @property
    def num_sessions(self) -> int:
        """Number of sessions including the base session (S + 1)."""
        return len(self.sessions)

    @property
    def num_incremental(self) -> int:
        """S: the number of incremental sessions."""
        return len(self.sessions) - 1

    @property
    def num_classes(self) -> int:
        return int(sum(len(s.classes) for s in self.sessions))

    @property
    def base_classes(self) -> np.ndarray:
        """(B,) class ids of the base session."""
        return self.sessions[0].classes

    @property
    def num_base_classes(self) -> int:
        return len(self.sessions[0].classes)

    @property
    def ways(self) -> int | None:
        """Classes per incremental session if every incremental session has the same number, else None."""
        counts = {len(s.classes) for s in self.sessions[1:]}
        return counts.pop() if len(counts) == 1 else None

    @property
    def shots(self) -> int | None:
        """Training samples per class in incremental sessions if uniform (from the session sizes), else None."""
        per_class = set()
        for s in self.sessions[1:]:
            if len(s.classes) == 0 or len(s.train_ids) % len(s.classes):
                return None
            per_class.add(len(s.train_ids) // len(s.classes))
        return per_class.pop() if len(per_class) == 1 else None

    # ---- class sets --------------------------------------------------------------------------------
    def _check_session(self, t: int) -> None:
        if not 0 <= t < len(self.sessions):
            raise FSCILError(f"protocol: session {t} out of range 0..{len(self.sessions) - 1}")

    def seen_classes(self, t: int) -> np.ndarray:
        """(C,) class ids introduced in sessions 0..t; equals arange(num_seen(t)) under the convention."""
        self._check_session(t)
        return _int64(np.concatenate([s.classes for s in self.sessions[: t + 1]]))

    def num_seen(self, t: int) -> int:
        self._check_session(t)
        return int(sum(len(s.classes) for s in self.sessions[: t + 1]))

    def novel_classes_upto(self, t: int) -> np.ndarray:
        """Class ids introduced by incremental sessions 1..t (empty for t = 0)."""
        self._check_session(t)
        if t == 0:
            return _int64([])
        return _int64(np.concatenate([s.classes for s in self.sessions[1 : t + 1]]))

    def test_ids_seen(self, t: int, labels: np.ndarray) -> np.ndarray:
        """Test sample ids whose class was seen by session t: the evaluation set after session t."""
        labels = np.asarray(labels)
        keep = np.isin(labels[self.test_ids], self.seen_classes(t))
        return self.test_ids[keep]

    # ---- validation --------------------------------------------------------------------------------
    def validate(self, labels: np.ndarray, ways: int | None = None, shots: int | None = None,
                 class_names: list[str] | None = None) -> None:
        """Raise FSCILError unless the protocol is consistent with `labels` (the class of every sample).

        Checks: class ids contiguous and session-ordered; sessions disjoint in classes and samples; every
        training sample belongs to its session's classes; incremental sessions have `ways` classes with
        `shots` samples each (when given); every class has >= 1 test sample; train and test disjoint.
        """
        labels = np.asarray(labels, dtype=np.int64)
        if len(labels) and labels.min() < 0:
            raise FSCILError("protocol: negative class label")

        def name(c: int) -> str:
            return f"{c} ({class_names[c]!r})" if class_names is not None and c < len(class_names) else str(c)

        expected_next = 0
        seen_ids: set[int] = set()
        for s in self.sessions:
            _check_session(s, labels, expected_next, seen_ids, ways, shots, name)
            expected_next += len(s.classes)
            seen_ids.update(s.train_ids.tolist())
        self._check_test(labels, seen_ids, name)

    def _check_test(self, labels: np.ndarray, train_ids: set[int], name) -> None:
        """Test ids within the labels, listed once, none a training sample, every class with a test image."""
        n, test = len(labels), self.test_ids
        if len(test) and (test.min() < 0 or test.max() >= n):
            raise FSCILError(f"protocol: test ids outside 0..{n - 1}")
        if len(np.unique(test)) != len(test):
            raise FSCILError("protocol: a test sample is listed twice")
        both = train_ids.intersection(test.tolist())
        if both:
            raise FSCILError(f"protocol: sample {min(both)} is both a training and a test sample")
        test_counts = np.bincount(labels[test], minlength=self.num_classes)[: self.num_classes]
        if (test_counts == 0).any():
            raise FSCILError(f"protocol: class {name(int(np.argmin(test_counts)))} has no test images")
        if len(test) and labels[test].max() >= self.num_classes:
            raise FSCILError("protocol: a test sample belongs to no session's class")
