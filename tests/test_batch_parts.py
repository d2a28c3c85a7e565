"""The parts a batch job runs on, each alone: the ordered writer, the folder's sweep, the lease,
the sharing of identical lines' answers and the window of lines in flight. Real files, a real
redis-server where a part keeps state there; no gateway, no worker, no model (tests/test_batch.py
runs them together, through faults)."""
from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from gateway.batch.jobs import JobStore, new_id
from gateway.batch.lease import JobLease, LeaseLost
from gateway.batch.lines import IdenticalLines
from gateway.batch.output import BLANK, LineResult
from gateway.batch.runner import LinesInFlight
from gateway.batch.sweep import FileSweep
from gateway.batch.writer import OrderedWriter
from ops.core import redis_keys
from ops.core.redis_clients import async_client
from ops.core.settings import Settings


def result(number: int, kind: str = "completed", tokens: int = 3) -> LineResult:
    return LineResult(number, {"custom_id": f"req-{number}", "response": {"status_code": 200}, "error": None}, kind,
                      tokens)


def output_numbers(path: Path) -> list[int]:
    return [int(json.loads(x)["custom_id"].split("-")[1]) for x in path.read_text().splitlines()]


# ---- the ordered writer -------------------------------------------------------------------------------


def settings_for(redis_server, tmp_path) -> Settings:
    return Settings(redis_url=redis_server.url, batch_files_dir=str(tmp_path), batch_lease_s=1.0)


async def started_job(store: JobStore) -> dict:
    job = await store.create(new_id("file"), "/v1/chat/completions", 3600, None, False, False)
    await store.update(job["id"], output_file_id=new_id("file"))
    await store.move(job["id"], "in_progress")
    return await store.get(job["id"])


async def lease_on(store: JobStore, job: dict, holder: str = "gw-a") -> JobLease:
    """The job's lease, taken by `holder` (not kept: these tests last well under its TTL)."""
    lease = JobLease(store, job["id"], holder, store.settings)
    assert await lease.take()
    return lease


def on_store(redis_server, tmp_path, test):
    async def main():
        client = async_client(redis_server.url)
        try:
            await test(JobStore(client, settings_for(redis_server, tmp_path)))
        finally:
            await client.aclose()
    asyncio.run(main())


def test_results_finishing_out_of_order_are_written_in_input_order_and_recorded_once_durable(redis_server, tmp_path):
    async def test(store: JobStore):
        job = await started_job(store)
        for number in (1, 2, 3):
            await store.record_in_flight(job["id"], number, f"rid-{number}", 60)
        writer = await OrderedWriter.open(store, job, await lease_on(store, job), "m")
        writer.put(3, result(3))
        writer.put(1, result(1))
        await writer.flush(force=True)
        path = store.path_for(job["output_file_id"])
        assert output_numbers(path) == [1]  # 3 waits for 2
        record = await store.get(job["id"])
        assert record["written"] == 1 and record["output_offset"] == path.stat().st_size
        assert await store.in_flight(job["id"]) == {2: "rid-2", 3: "rid-3"}
        writer.put(2, result(2, kind="failed", tokens=0))
        await writer.flush(force=True)
        writer.close()
        assert output_numbers(path) == [1, 2, 3]
        record = await store.get(job["id"])
        assert (record["written"], record["completed"], record["failed"], record["output_tokens"]) == (3, 2, 1, 6)
        assert record["output_offset"] == path.stat().st_size and await store.in_flight(job["id"]) == {}
    on_store(redis_server, tmp_path, test)


def test_a_writer_continuing_a_job_cuts_what_the_record_does_not_vouch_for_and_writes_each_line_once(
        redis_server, tmp_path):
    async def test(store: JobStore):
        job = await started_job(store)
        lease = await lease_on(store, job)
        first = await OrderedWriter.open(store, job, lease, "m")
        for number in (1, 2):
            first.put(number, result(number))
        await first.flush(force=True)
        vouched = store.path_for(job["output_file_id"]).read_text()
        # The first runner writes line 3 (an answer longer than the next runner's will be) and
        # half of line 4, and dies before its record says so.
        died_on = {**result(3).line, "response": {"status_code": 200, "body": "a long answer " * 20}}
        first.output.write((json.dumps(died_on) + "\n" + json.dumps(result(4).line)[:20]).encode())
        first.close()
        second = await OrderedWriter.open(store, await store.get(job["id"]), lease, "m")
        assert second.written == 2
        for number in (4, 3):
            second.put(number, result(number))
        await second.flush(force=True)
        second.close()
        path = store.path_for(job["output_file_id"])
        assert path.read_text() == vouched + "".join(json.dumps(result(n).line) + "\n" for n in (3, 4))
        assert output_numbers(path) == [1, 2, 3, 4]
        assert (await store.get(job["id"]))["completed"] == 4
    on_store(redis_server, tmp_path, test)


def test_a_runner_that_lost_its_lease_unseen_changes_neither_the_output_nor_the_record(redis_server, tmp_path):
    """Two runners of one job at once: a failover lost the lease key (or the first stalled past
    its TTL), so a second gateway took the job while the first still writes. Whatever order
    their writes come in, the output is the holder's: every line JSON, each once, in order."""
    async def test(store: JobStore):
        job = await started_job(store)
        stale = await lease_on(store, job, "gw-a")
        first = await OrderedWriter.open(store, job, stale, "m")
        for number in (1, 2):
            first.put(number, result(number))
        await first.flush(force=True)
        await store.redis.delete(redis_keys.batch_lease(job["id"]))  # what a failover that lost the key leaves
        holder = await lease_on(store, job, "gw-b")
        second = await OrderedWriter.open(store, await store.get(job["id"]), holder, "m")
        second.put(3, result(3))
        await second.flush(force=True)
        # The stale runner's answers to 3 and 4 (longer than the holder's): refused at its record
        # update, after it wrote them to its file.
        for number in (3, 4):
            first.put(number, LineResult(number, {**result(number).line, "response": {"status_code": 200,
                                                                                        "body": "stale " * 30}},
                                         "completed", 3))
        with pytest.raises(LeaseLost):
            await first.flush(force=True)
        assert stale.lost.is_set()
        with pytest.raises(LeaseLost):
            await stale.move("finalizing")
        first.close()
        second.put(4, result(4))
        await second.flush(force=True)
        second.close()
        path = store.path_for(job["output_file_id"])
        assert path.read_text() == "".join(json.dumps(result(n).line) + "\n" for n in (1, 2, 3, 4))
        record = await store.get(job["id"])
        assert (record["state"], record["written"], record["completed"]) == ("in_progress", 4, 4)
        assert record["output_offset"] == path.stat().st_size
        assert sorted(p.name for p in path.parent.iterdir() if ".part" in p.name) == []
    on_store(redis_server, tmp_path, test)


def test_a_stopping_writer_writes_what_finished_in_order_and_blank_lines_write_nothing(redis_server, tmp_path):
    async def test(store: JobStore):
        job = await started_job(store)
        writer = await OrderedWriter.open(store, job, await lease_on(store, job), "m")
        writer.put(4, result(4))
        writer.put(1, BLANK)
        writer.put(2, result(2))
        await writer.flush(force=True, skip_gaps=True)  # line 3 never ran
        writer.close()
        assert output_numbers(store.path_for(job["output_file_id"])) == [2, 4]
        record = await store.get(job["id"])
        assert record["written"] == 4 and record["completed"] == 2
    on_store(redis_server, tmp_path, test)


# ---- the folder's sweep ---------------------------------------------------------------------------------


def test_the_sweep_removes_files_nothing_names_once_old_and_keeps_every_file_a_record_or_a_live_job_names(
        redis_server, tmp_path):
    async def test(store: JobStore):
        folder = store.settings.batch_dir
        day = store.settings.batch_retention_s
        running = await started_job(store)  # active, its output being written: no file record yet
        paths = {name: folder / name for name in (
            "file_expired.jsonl", "file_recorded.jsonl", f"{running['output_file_id']}.jsonl", "file_fresh.jsonl",
            "file_x.jsonl.ab12.part", "file_y.jsonl.cd34.part", "batch_gone.checked.jsonl",
            f"{running['id']}.checked.jsonl", "notes.txt")}
        for path in paths.values():
            path.write_text("{}\n")
        await store.add_file("file_recorded", "in.jsonl", "batch", 3600)
        old, hour_and_more = time.time() - day - 60, time.time() - 3700
        for name in paths:
            if name != "file_fresh.jsonl":
                os.utime(paths[name], (old, old))
        os.utime(paths["file_y.jsonl.cd34.part"], (hour_and_more, hour_and_more))
        os.utime(paths["file_x.jsonl.ab12.part"], (time.time() - 60,) * 2)  # a copy under way
        removed = await FileSweep(store).sweep()
        assert sorted(removed) == ["batch_gone.checked.jsonl", "file_expired.jsonl", "file_y.jsonl.cd34.part"]
        assert sorted(p.name for p in folder.iterdir()) == sorted(set(paths) - set(removed))
        await store.move(running["id"], "completed")  # ended, and its records gone: its files go too
        await store.redis.delete(redis_keys.batch_job(running["id"]))
        assert sorted(await FileSweep(store).sweep()) == sorted([f"{running['output_file_id']}.jsonl",
                                                                  f"{running['id']}.checked.jsonl"])
    on_store(redis_server, tmp_path, test)


# ---- the lease ------------------------------------------------------------------------------------------


def test_a_kept_lease_outlives_its_ttl_and_no_other_gateway_takes_the_job(redis_server, tmp_path):
    async def test(store: JobStore):
        job_id = new_id("batch")
        ours, theirs = (JobLease(store, job_id, gateway, store.settings) for gateway in ("gw-a", "gw-b"))
        assert await ours.take()
        ours.keep()
        assert 0 < await store.redis.ttl(redis_keys.batch_lease(job_id)) <= 1
        await asyncio.sleep(2.5)  # past the 1 s TTL: only the renewals keep it
        assert not await theirs.take() and not ours.lost.is_set()
        await ours.drop()
        assert await theirs.take()
        await theirs.drop()
    on_store(redis_server, tmp_path, test)


def test_a_lease_another_gateway_took_meanwhile_is_lost_and_left_to_it(redis_server, tmp_path):
    async def test(store: JobStore):
        job_id = new_id("batch")
        stalled, other = (JobLease(store, job_id, gateway, store.settings) for gateway in ("gw-a", "gw-b"))
        assert await stalled.take()
        # The first holder stalled past its TTL (its key lapsed) and another gateway took the job.
        redis_server.client.delete(redis_keys.batch_lease(job_id))
        assert await other.take()
        stalled.keep()
        await asyncio.wait_for(stalled.lost.wait(), 3)
        await stalled.drop()
        assert redis_server.client.get(redis_keys.batch_lease(job_id)) == "gw-b"
        await other.drop()
    on_store(redis_server, tmp_path, test)


# ---- identical lines --------------------------------------------------------------------------------------


def test_identical_lines_are_asked_once_and_every_copy_takes_the_first_answer():
    async def main():
        identical: IdenticalLines[str] = IdenticalLines()
        asked: list[str] = []
        release = asyncio.Event()

        async def ask() -> str:
            asked.append("key")
            await release.wait()
            return "the answer"

        lines = [asyncio.create_task(identical.answer("key", ask)) for _ in range(3)]
        await asyncio.sleep(0.05)
        release.set()
        assert await asyncio.gather(*lines) == [("the answer", False), ("the answer", True), ("the answer", True)]
        assert asked == ["key"]
        # A line without a key (sampled, unseeded) is always asked.
        assert await identical.answer(None, ask) == ("the answer", False) and len(asked) == 2
    asyncio.run(main())


def test_a_first_line_that_fails_takes_its_key_with_it_and_the_next_copy_asks_again():
    async def main():
        identical: IdenticalLines[str] = IdenticalLines()
        release = asyncio.Event()

        async def fail() -> str:
            await release.wait()
            raise ConnectionError("redis away")

        first = asyncio.create_task(identical.answer("key", fail))
        await asyncio.sleep(0.01)
        copy = asyncio.create_task(identical.answer("key", fail))
        await asyncio.sleep(0.01)
        release.set()
        for line in (first, copy):
            with pytest.raises(ConnectionError):
                await line

        async def ask() -> str:
            return "asked again"
        assert await identical.answer("key", ask) == ("asked again", False)
    asyncio.run(main())


def test_only_the_last_distinct_keys_are_remembered():
    async def main():
        identical: IdenticalLines[str] = IdenticalLines(capacity=2)
        asked: list[str] = []

        def asking(key: str):
            async def ask() -> str:
                asked.append(key)
                return key
            return ask

        for key in ("a", "b", "c", "a"):
            await identical.answer(key, asking(key))
        assert asked == ["a", "b", "c", "a"]  # "a" was forgotten when "c" came
    asyncio.run(main())


# ---- the window --------------------------------------------------------------------------------------------


def test_the_window_gives_back_finished_lines_and_a_stopped_line_leaves_no_result():
    async def main():
        window = LinesInFlight("batch_x")
        never = asyncio.Event()

        async def answered(number: int) -> LineResult:
            return result(number)

        async def waits_for_ever(number: int) -> LineResult:
            await never.wait()
            return result(number)

        window.start(1, answered(1))
        window.start(2, waits_for_ever(2))
        await window.wait_some(timeout_s=1)
        assert [n for n, _ in window.finished()] == [1] and len(window) == 1
        assert window.tasks[2].get_name() == "batch-line:batch_x:2"
        await window.stop()
        assert window.finished() == [] and len(window) == 0
    asyncio.run(main())
