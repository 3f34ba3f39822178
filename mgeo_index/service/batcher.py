"""Dynamic batching: concurrent requests share one resolver call.

Submissions (one request's items: queries or pairs) wait in two lanes, ``interactive`` and ``bulk``. One loop
takes up to ``max_batch`` items — interactive submissions first, bulk submissions only fill what is left, so bulk
traffic cannot starve single queries — as soon as the batch is full or the oldest waiting submission has
waited ``max_wait_ms`` — except for a lone caller: when the previous batch held one item and nothing was
waiting after it, the next request runs at once instead of waiting for company that is not coming
(requests that arrive meanwhile form the next batch). The whole batch goes to ``run_batch`` on one worker thread (one encode, one
search, one rerank), and each submission's future gets its slice of the answer.

Limits: each lane holds at most ``max_queue`` items; past that :meth:`Batcher.submit` raises
:class:`QueueFull` with a Retry-After estimate. A submission that cannot finish before its deadline (by the
time per item measured for its kind of work — its ``(kind, params)``: a ``top_k`` 100 resolve costs more than a
retrieval-only one — on batches at least its size) is answered with :class:`DeadlineExceeded` without being
computed, and a batch stops growing when it would end after its earliest deadline. Work of a kind or size never
measured is never refused by estimate (a fresh server takes its own largest request); its caller's deadline still
holds; a submission whose caller stopped waiting (its
future cancelled) is dropped. Every submission's future is resolved at most once.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

LANES = ("interactive", "bulk")


class QueueFull(Exception):
    """The lane's queue is full: answer 429 and ask the caller to come back after ``retry_after`` s."""

    def __init__(self, lane: str, retry_after: int) -> None:
        super().__init__(f"the {lane} queue is full; retry after {retry_after} s")
        self.lane = lane
        self.retry_after = retry_after


class DeadlineExceeded(Exception):
    """The submission cannot be answered before its deadline: it passed while the submission was queued, or the
    submission alone would take longer (``estimate``: its seconds, from the time measured per item)."""

    def __init__(self, estimate: float | None = None) -> None:
        super().__init__(estimate)
        self.estimate = estimate


@dataclass(eq=False)
class Submission:
    """One request's items (queries or pairs), queued in a lane until a batch takes them all; its future
    gets their results."""

    kind: str  # "resolve" or "match": run_batch groups submissions by (kind, params)
    params: Hashable
    items: Sequence
    lane: str = "interactive"
    deadline: float = math.inf  # in loop.time() seconds
    future: asyncio.Future | None = field(default=None, repr=False)
    enqueued: float = 0.0


class Batcher:
    """Queue + batching loop. ``run_batch(submissions) -> one result per submission`` runs on a worker thread."""

    def __init__(
        self,
        run_batch: Callable[[list[Submission]], list],
        *,
        max_batch: int = 32,
        max_wait_ms: float = 3.0,
        max_queue: int = 1024,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> None:
        if max_batch < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError("max_batch and max_queue must be ≥ 1 and max_wait_ms ≥ 0")
        self.run_batch = run_batch
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000
        self.max_queue = max_queue
        self.on_batch = on_batch
        self.lanes: dict[str, deque[Submission]] = {lane: deque() for lane in LANES}
        self.queued = dict.fromkeys(LANES, 0)  # items (not submissions) waiting per lane
        self.seconds_per_item = 0.05  # running estimate over all work, for Retry-After
        # (kind, params) -> (seconds per item, the most items of a batch it was measured on), for deadlines
        self.cost: dict[Hashable, tuple[float, int]] = {}
        self.lone = True  # the last batch had one item and left nothing queued: don't wait for more
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mgeo-batch")
        self._task: asyncio.Task | None = None

    # -- callers ------------------------------------------------------------------------------
    def submit(self, submission: Submission) -> asyncio.Future:
        """Queue a submission; its future gets run_batch's result for it (or an exception)."""
        if submission.lane not in LANES:
            raise ValueError(f"lane must be one of {LANES}, not {submission.lane!r}")
        if self.queued[submission.lane] + len(submission.items) > self.max_queue:
            raise QueueFull(submission.lane, self.retry_after())
        loop = asyncio.get_running_loop()
        submission.future = loop.create_future()
        submission.enqueued = loop.time()
        self.lanes[submission.lane].append(submission)
        self.queued[submission.lane] += len(submission.items)
        self._wake.set()
        return submission.future

    async def run_exclusive(self, fn: Callable[[], object]) -> object:
        """Run ``fn`` on the worker thread between two batches (compute never runs on two threads)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def retry_after(self) -> int:
        """Seconds until the queued work is likely done (at least 1)."""
        return max(1, math.ceil(sum(self.queued.values()) * self.seconds_per_item))

    # -- the loop -----------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="mgeo-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for lane in LANES:  # nothing waits forever
            while self.lanes[lane]:
                submission = self.lanes[lane].popleft()
                if not submission.future.done():
                    submission.future.set_exception(RuntimeError("the server is shutting down"))
            self.queued[lane] = 0
        self._executor.shutdown(wait=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wait_for_batch(loop)
            batch = self._take(loop.time())
            if not batch:
                continue
            items = sum(len(submission.items) for submission in batch)
            started = time.perf_counter()
            try:
                results = await loop.run_in_executor(self._executor, self.run_batch, batch)
                if len(results) != len(batch):
                    raise RuntimeError(f"run_batch returned {len(results)} results for {len(batch)} submissions")
            except Exception as exc:  # noqa: BLE001 - every waiting caller gets the error, the loop goes on
                for submission in batch:
                    if not submission.future.done():
                        submission.future.set_exception(exc)
            else:
                for submission, result in zip(batch, results):
                    if not submission.future.done():  # the caller may have given up (deadline)
                        submission.future.set_result(result)
            seconds = time.perf_counter() - started
            self.seconds_per_item = 0.8 * self.seconds_per_item + 0.2 * seconds / items
            for key in {(submission.kind, submission.params) for submission in batch}:
                self.measured(key, items, seconds)
            self.lone = items == 1 and not any(self.lanes.values())
            if self.on_batch is not None:
                self.on_batch(items, seconds)

    async def _wait_for_batch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Until something is queued, then until the batch is full or the oldest submission waited max_wait."""
        while not any(self.lanes.values()):
            self._wake.clear()
            await self._wake.wait()
        while not self.lone and sum(self.queued.values()) < self.max_batch:
            oldest = min(lane[0].enqueued for lane in self.lanes.values() if lane)
            remaining = oldest + self.max_wait - loop.time()
            if remaining <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except asyncio.TimeoutError:
                return

    def measured(self, key: Hashable, items: int, seconds: float) -> None:
        """Record that a batch of ``items`` items holding work of kind ``key`` took ``seconds``."""
        per_item, largest = self.cost.get(key, (seconds / items, 0))
        self.cost[key] = (0.8 * per_item + 0.2 * seconds / items, max(largest, items))

    def _per_item(self, submission: Submission) -> float | None:
        """Seconds per item of the submission's kind of work, when measured on a batch at least its size."""
        known = self.cost.get((submission.kind, submission.params))
        return known[0] if known is not None and len(submission.items) <= known[1] else None

    def _take(self, now: float) -> list[Submission]:
        """Up to max_batch items, interactive first; a submission is never split; lanes stay FIFO.

        Deadline-aware, from the measured time per item (:meth:`_per_item`): a submission that could not finish
        before its deadline even alone is answered DeadlineExceeded at once (no work wasted on a caller who will
        be gone), and a batch stops growing when it would no longer finish before its earliest deadline. Work
        not measured yet counts as free: never refused by estimate.
        """
        batch: list[Submission] = []
        size = 0
        cost = 0.0  # estimated seconds of the batch so far
        earliest = math.inf
        for lane in LANES:
            queue = self.lanes[lane]
            while queue:
                submission = queue[0]
                per_item = self._per_item(submission)
                own = 0.0 if per_item is None else len(submission.items) * per_item
                if submission.future.done() or now + own > submission.deadline:
                    queue.popleft()
                    self.queued[lane] -= len(submission.items)
                    if not submission.future.done():
                        submission.future.set_exception(DeadlineExceeded(own if own > submission.deadline - now
                                                                         else None))
                    continue
                ends = now + cost + own
                if batch and (size + len(submission.items) > self.max_batch or ends > min(earliest, submission.deadline)):
                    return batch
                queue.popleft()
                self.queued[lane] -= len(submission.items)
                batch.append(submission)
                size += len(submission.items)
                cost += own
                earliest = min(earliest, submission.deadline)
                if size >= self.max_batch:
                    return batch
        return batch
