"""The dynamic batcher on its own: lanes, batch limits, deadlines, full queues, failures."""
import asyncio

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[serve]')")

from mgeo_index.service.batcher import Batcher, DeadlineExceeded, QueueFull, Submission  # noqa: E402


def upper_batches(record: list):
    """A real batch function: upper-cases every item and records which items ran together."""

    def run_batch(jobs: list[Submission]) -> list:
        record.append([item for job in jobs for item in job.items])
        return [[item.upper() for item in job.items] for job in jobs]

    return run_batch


def test_interactive_jobs_go_first_and_bulk_fills_the_rest():
    ran: list = []

    async def main():
        batcher = Batcher(upper_batches(ran), max_batch=3, max_wait_ms=1000)
        bulk = [batcher.submit(Submission("resolve", (), [f"b{i}"], lane="bulk")) for i in range(4)]
        interactive = [batcher.submit(Submission("resolve", (), [f"i{i}"])) for i in range(2)]
        batcher.start()
        results = await asyncio.gather(*interactive, *bulk)
        await batcher.stop()
        return results

    results = asyncio.run(main())
    assert ran == [["i0", "i1", "b0"], ["b1", "b2", "b3"]]
    assert results == [["I0"], ["I1"], ["B0"], ["B1"], ["B2"], ["B3"]]


def test_batches_respect_max_batch_and_never_split_a_job():
    ran: list = []

    async def main():
        batcher = Batcher(upper_batches(ran), max_batch=4, max_wait_ms=1000)
        futures = [batcher.submit(Submission("resolve", (), items)) for items in (["a", "b", "c"], ["d", "e"], ["f"], list("ghijkl"))]
        batcher.start()
        results = await asyncio.gather(*futures)
        await batcher.stop()
        return results

    results = asyncio.run(main())
    assert ran == [["a", "b", "c"], ["d", "e", "f"], list("ghijkl")]  # an oversized job runs alone
    assert results == [["A", "B", "C"], ["D", "E"], ["F"], list("GHIJKL")]


def test_a_lone_caller_is_not_held_back_but_concurrent_callers_wait_for_company():
    ran: list = []

    async def main():
        # with a one-hour max wait, only "lone caller" or "the batch is full" can let a job through
        batcher = Batcher(upper_batches(ran), max_batch=4, max_wait_ms=3_600_000)
        batcher.start()
        assert await asyncio.wait_for(batcher.submit(Submission("resolve", (), ["x"])), 30) == ["X"]
        assert await asyncio.wait_for(batcher.submit(Submission("resolve", (), ["y"])), 30) == ["Y"]
        pair = [batcher.submit(Submission("resolve", (), [c])) for c in "ab"]  # two at once: they run together
        await asyncio.wait_for(asyncio.gather(*pair), 30)
        waiting = batcher.submit(Submission("resolve", (), ["c"]))  # after a shared batch, wait for company
        await asyncio.sleep(0.2)
        assert not waiting.done()
        rest = [batcher.submit(Submission("resolve", (), [c])) for c in "def"]
        await asyncio.wait_for(asyncio.gather(waiting, *rest), 30)
        await batcher.stop()

    asyncio.run(main())
    assert ran == [["x"], ["y"], ["a", "b"], ["c", "d", "e", "f"]]


def test_full_queue_raises_with_retry_after_and_lanes_are_bounded_separately():
    async def main():
        batcher = Batcher(upper_batches([]), max_batch=8, max_queue=3)
        batcher.submit(Submission("resolve", (), ["a", "b"]))
        with pytest.raises(QueueFull) as full:
            batcher.submit(Submission("resolve", (), ["c", "d"]))
        assert full.value.retry_after >= 1 and full.value.lane == "interactive"
        batcher.submit(Submission("resolve", (), ["c"]))  # exactly at the limit
        batcher.submit(Submission("resolve", (), ["x", "y", "z"], lane="bulk"))  # the bulk lane has its own room
        assert batcher.queued == {"interactive": 3, "bulk": 3}
        await batcher.stop()

    asyncio.run(main())


def test_expired_and_abandoned_jobs_are_not_computed():
    ran: list = []

    async def main():
        batcher = Batcher(upper_batches(ran), max_batch=8, max_wait_ms=1000)
        loop = asyncio.get_running_loop()
        expired = batcher.submit(Submission("resolve", (), ["late"], deadline=loop.time() - 1))
        abandoned = batcher.submit(Submission("resolve", (), ["gone"]))
        abandoned.cancel()
        kept = batcher.submit(Submission("resolve", (), ["kept"]))
        batcher.start()
        assert await kept == ["KEPT"]
        with pytest.raises(DeadlineExceeded):
            await expired
        await batcher.stop()

    asyncio.run(main())
    assert ran == [["kept"]]


def test_a_failing_batch_fails_its_jobs_and_the_loop_goes_on():
    calls: list = []

    def run_batch(jobs):
        calls.append(len(jobs))
        if any("boom" in job.items for job in jobs):
            raise RuntimeError("model exploded")
        return [list(job.items) for job in jobs]

    async def main():
        batcher = Batcher(run_batch, max_batch=1)
        batcher.start()
        with pytest.raises(RuntimeError, match="model exploded"):
            await batcher.submit(Submission("resolve", (), ["boom"]))
        assert await batcher.submit(Submission("resolve", (), ["fine"])) == ["fine"]
        await batcher.stop()

    asyncio.run(main())
    assert calls == [1, 1]


def test_stop_answers_every_queued_job():
    async def main():
        batcher = Batcher(upper_batches([]), max_batch=1)
        future = batcher.submit(Submission("resolve", (), ["never run"]))  # the loop was never started
        await batcher.stop()
        with pytest.raises(RuntimeError, match="shutting down"):
            await future

    asyncio.run(main())


def test_batches_are_cut_to_meet_deadlines_and_hopeless_jobs_are_shed():
    ran: list = []

    async def main():
        batcher = Batcher(upper_batches(ran), max_batch=8, max_wait_ms=1000)
        batcher.measured(("resolve", ()), 8, 80.0)  # as measured on a slow model: 10 s an item
        now = asyncio.get_running_loop().time()
        hopeless = batcher.submit(Submission("resolve", (), ["x"], deadline=now + 5))  # needs 10 s, has 5
        first = [batcher.submit(Submission("resolve", (), [c], deadline=now + 35)) for c in "abcd"]  # 3 fit in 35 s
        batcher.start()
        await asyncio.gather(*first)
        with pytest.raises(DeadlineExceeded):
            await hopeless
        await batcher.stop()

    asyncio.run(main())
    assert ran[0] == ["a", "b", "c"] and ran[1] == ["d"]


def test_work_never_measured_is_not_refused_by_estimate():
    """A fresh server takes its own largest request; a slow kind of work measured does not refuse a cheap kind."""
    ran: list = []

    async def main():
        batcher = Batcher(upper_batches(ran), max_batch=256, max_wait_ms=1)
        batcher.start()
        now = asyncio.get_running_loop().time()
        big = [f"q{i}" for i in range(256)]
        assert len(await batcher.submit(Submission("resolve", (10, False), big, deadline=now + 10))) == 256
        batcher.measured(("resolve", (100, True)), 1, 60.0)  # top_k 100 with rerank: a minute an item
        now = asyncio.get_running_loop().time()
        cheap = batcher.submit(Submission("resolve", (10, False), ["x"], deadline=now + 10))
        assert await cheap == ["X"]
        bigger = batcher.submit(Submission("resolve", (100, True), ["a", "b"], deadline=now + 10))  # 2 > 1 measured
        assert await bigger == ["A", "B"]
        with pytest.raises(DeadlineExceeded) as refused:  # measured at this size: it cannot make it
            await batcher.submit(Submission("resolve", (100, True), ["c"], deadline=now + 10))
        assert refused.value.estimate > 10  # the refusal tells the caller how long it would take: past its deadline
        await batcher.stop()

    asyncio.run(main())
