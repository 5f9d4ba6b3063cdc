"""The client commands (`streampool submit/follow/status/cancel`) as real processes against the system."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from cli.main import (
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    build_parser,
    job_request,
    main,
)
from shared.requests import ChatMessage, JobRequest
from tests.conftest import System
from tests.gateway.keyed_gateway import KEY_A, KEY_B, KeyedGateway, bearer
from tests.processes import ROOT, free_port

STREAMPOOL = [sys.executable, "-m", "cli"]
JOB_ID = re.compile(r"\b[0-9a-f]{32}\b")
FOLLOW_HINT = re.compile(r"streampool follow ([0-9a-f]{32}) --after (\S+) --url (\S+)")
# Greedy decoding of this prompt counts on for hundreds of tokens: the job outlives a Ctrl-C.
LONG_PROMPT = ["Count from 1 to 1000: 1, 2, 3,", "--temperature", "0"]
EXIT_TIMEOUT = 120  # a guard against a hung child, not a measurement


def command(system: System, *args: str) -> list[str]:
    return [*STREAMPOOL, *args, "--url", system.base_url]


@pytest.fixture(scope="module")
def system(synthetic_system: System) -> System:
    """The subject is the client commands, not generation: its workers run the synthetic engine."""
    return synthetic_system


def run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=EXIT_TIMEOUT)


def record(system: System, job_id: str) -> dict[str, Any]:
    answer = httpx.get(f"{system.base_url}/v1/jobs/{job_id}")
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def finished_job(system: System, prompt: str, max_tokens: int = 16, *flags: str) -> str:
    """A job run to its end (`follow` returns when it ends)."""
    job_id = run(command(system, "submit", prompt, "--max-tokens", str(max_tokens), *flags)).stdout.strip()
    assert run(command(system, "follow", job_id)).returncode == EXIT_OK
    return job_id


@contextmanager
def sigint_reaches_children() -> Iterator[None]:
    """Children started here get Ctrl-C even when this run ignores it (as a background job does)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class Streaming:
    """A `submit --stream` child, seen once its job runs: its job id and the text printed so far."""

    def __init__(self, system: System, *args: str) -> None:
        with sigint_reaches_children():
            self.process = subprocess.Popen(
                command(system, "submit", "--stream", *args),
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        assert self.process.stdout is not None and self.process.stderr is not None
        self.stdout, self.stderr = self.process.stdout, self.process.stderr
        self.first_line = self.stderr.readline().decode()
        found = JOB_ID.search(self.first_line)
        assert found, self.first_line
        self.job_id = found.group()
        self.printed = os.read(self.stdout.fileno(), 65536)  # the first tokens: the job is running

    def __enter__(self) -> Streaming:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.process.poll() is None:  # a failed test left it running
            self.process.kill()
        self.process.__exit__(None, None, None)  # closes the pipes and reaps the process

    def finish(self) -> tuple[int, str, str]:
        """Exit code, all of stdout and all of stderr; the outputs are far below a pipe's capacity."""
        code = self.process.wait(timeout=EXIT_TIMEOUT)
        return (
            code,
            (self.printed + self.stdout.read()).decode(),
            self.first_line + self.stderr.read().decode(),
        )


def test_submit_prints_only_the_job_id(system: System) -> None:
    result = run(command(system, "submit", "Hello", "--max-tokens", "4"))
    assert result.returncode == EXIT_OK, result.stderr
    assert re.fullmatch(r"[0-9a-f]{32}\n", result.stdout)
    assert record(system, result.stdout.strip())["id"] == result.stdout.strip()


def test_the_same_idempotency_key_gives_the_same_job(system: System) -> None:
    args = ["submit", "Hello", "--max-tokens", "2", "--idempotency-key", f"cli-{uuid.uuid4().hex}"]
    assert run(command(system, *args)).stdout == run(command(system, *args)).stdout != ""


def test_submit_stream_prints_exactly_the_generated_text_then_a_summary(system: System) -> None:
    result = run(
        command(
            system,
            "submit",
            "--stream",
            "Name three rivers.",
            "--system",
            "Answer in a few words.",
            "--max-tokens",
            "24",
            "--stream-step",
            "2",
            "--temperature",
            "0",
        )
    )
    assert result.returncode == EXIT_OK, result.stderr
    found = JOB_ID.search(result.stderr)
    assert found, result.stderr
    job = record(system, found.group())
    assert result.stdout == job["output"]["text"] != ""
    summary = result.stderr.splitlines()[-1]
    assert summary.startswith(f"completed ({job['finish_reason']}), {job['output']['token_count']} tokens")
    assert summary.endswith("tokens/s")


def test_follow_of_a_finished_job_prints_its_whole_text(system: System) -> None:
    job_id = finished_job(system, "The capital of France is")
    # As bytes: `run`'s universal newlines would turn a drawn token's "\r\n" into "\n".
    result = subprocess.run(
        command(system, "follow", job_id), cwd=ROOT, capture_output=True, timeout=EXIT_TIMEOUT
    )
    assert result.returncode == EXIT_OK
    assert result.stdout.decode() == record(system, job_id)["output"]["text"] != ""


def test_follow_after_a_cursor_prints_only_the_text_after_it(system: System) -> None:
    # Greedy, and a prompt that goes on: a sampled answer may end within the first few tokens.
    job_id = finished_job(system, "Count from 1 to 100: 1, 2, 3,", 20, "--temperature", "0")
    events = httpx.get(f"{system.base_url}/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["events"]
    cursor = events[5]["id"]  # queued, running, then four deltas
    rest = "".join(event["text"] for event in events[6:] if event["type"] == "delta")
    result = run(command(system, "follow", job_id, "--after", cursor))
    assert result.returncode == EXIT_OK
    assert result.stdout == rest != ""
    assert record(system, job_id)["output"]["text"] != rest


def test_status_prints_the_record_as_json_with_json_flag_or_in_a_pipe(system: System) -> None:
    job_id = finished_job(system, "Hello")
    expected = record(system, job_id)
    for args in (["status", job_id, "--json"], ["status", job_id]):
        result = run(command(system, *args))
        assert result.returncode == EXIT_OK
        assert json.loads(result.stdout) == expected


def read_terminal(fd: int, timeout: float = 60) -> bytes:
    """What the command wrote to its terminal until it closed it (within `timeout` seconds)."""
    chunks = []
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0 and select.select([fd], [], [], remaining)[0], "the command closes its terminal"
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the command's side of the terminal has closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_status_on_a_terminal_is_a_coloured_table(system: System) -> None:
    job_id = finished_job(system, "Hello")
    leader, follower = pty.openpty()
    env = {key: value for key, value in os.environ.items() if key != "NO_COLOR"}
    process = subprocess.Popen(
        command(system, "status", job_id), cwd=ROOT, env={**env, "TERM": "xterm-256color"}, stdout=follower
    )
    os.close(follower)
    shown = read_terminal(leader).decode()
    os.close(leader)
    assert process.wait(timeout=EXIT_TIMEOUT) == EXIT_OK
    assert job_id in shown and "completed" in shown
    assert "\x1b[" in shown  # colour
    assert not shown.lstrip().startswith("{")


CANCEL_TRIES = 3


def test_cancel_of_a_running_job_ends_its_stream_cancelled(system: System) -> None:
    # ignore_eos and nearly the whole context: the job runs for many seconds. A loaded machine has
    # been seen to start the cancel command only after a 1,000-token job had ended; such a try says
    # so ("completed: job already completed") and the test takes a new job.
    for _ in range(CANCEL_TRIES):
        streaming = Streaming(system, *LONG_PROMPT, "--max-tokens", "2000", "--ignore-eos")
        cancel = run(command(system, "cancel", streaming.job_id))
        assert cancel.returncode == EXIT_OK
        if not cancel.stdout.startswith("completed: job already completed"):
            break
        streaming.__exit__()
    with streaming:
        assert cancel.stdout.startswith("running: cancel requested"), cancel.stdout
        code, printed, _ = streaming.finish()
        assert code == EXIT_CANCELLED
        follow = run(command(system, "follow", streaming.job_id))
        assert follow.returncode == EXIT_CANCELLED
        job = record(system, streaming.job_id)
        assert job["status"] == "cancelled"
        assert printed == follow.stdout == job["output"]["text"]


def test_ctrl_c_detaches_and_the_hint_resumes_exactly_where_the_text_stopped(system: System) -> None:
    with Streaming(system, *LONG_PROMPT, "--max-tokens", "120") as streaming:
        streaming.process.send_signal(signal.SIGINT)
        code, printed, stderr = streaming.finish()
        assert code == EXIT_INTERRUPTED
        hint = FOLLOW_HINT.search(stderr)
        assert hint, stderr
        assert f"streampool cancel {streaming.job_id}" in stderr
        job_id, cursor, url = hint.groups()
        assert (job_id, url) == (streaming.job_id, system.base_url)
        rest = run([*STREAMPOOL, "follow", job_id, "--after", cursor, "--url", url])
        assert rest.returncode == EXIT_OK  # the job went on without its first client
        job = record(system, job_id)
        assert job["status"] == "completed"
        assert printed + rest.stdout == job["output"]["text"]


def test_ctrl_c_with_cancel_on_exit_cancels_the_job(system: System) -> None:
    with Streaming(system, *LONG_PROMPT, "--max-tokens", "1000", "--cancel-on-exit") as streaming:
        streaming.process.send_signal(signal.SIGINT)
        code, _, stderr = streaming.finish()
        assert code == EXIT_INTERRUPTED
        assert "cancel requested" in stderr
        assert run(command(system, "follow", streaming.job_id)).returncode == EXIT_CANCELLED
        assert record(system, streaming.job_id)["status"] == "cancelled"


def test_a_closed_pipe_ends_the_stream_quietly(system: System) -> None:
    with Streaming(system, *LONG_PROMPT, "--max-tokens", "1000") as streaming:
        streaming.stdout.close()  # as `| head -c 10` does once it has its bytes
        code = streaming.process.wait(timeout=EXIT_TIMEOUT)
        stderr = streaming.stderr.read().decode()
        run(command(system, "cancel", streaming.job_id))
        assert code == EXIT_FAILED
        assert "Traceback" not in stderr


@pytest.mark.parametrize("job_command", ["status", "follow", "cancel"])
def test_an_unknown_job_is_not_found(system: System, job_command: str) -> None:
    result = run(command(system, job_command, "0" * 32))
    assert result.returncode == EXIT_FAILED
    assert result.stderr.startswith("not_found: ")
    assert result.stdout == ""


def test_the_url_comes_from_streampool_url_without_the_flag(system: System) -> None:
    result = run(
        [*STREAMPOOL, "submit", "Hello", "--max-tokens", "2"],
        env={**os.environ, "STREAMPOOL_URL": system.base_url},
    )
    assert result.returncode == EXIT_OK, result.stderr
    assert record(system, result.stdout.strip())["status"] in {"queued", "running", "completed"}


def test_the_api_key_comes_from_the_flag_or_streampool_api_key(keyed: KeyedGateway) -> None:
    submitted = httpx.post(f"{keyed.base_url}/v1/jobs", json={"prompt": "hi"}, headers=bearer(KEY_A))
    job_id = submitted.json()["id"]
    status = [*STREAMPOOL, "status", job_id, "--json", "--url", keyed.base_url]
    without_key = {name: value for name, value in os.environ.items() if name != "STREAMPOOL_API_KEY"}
    refused = run(status, env=without_key)
    assert refused.returncode == EXIT_FAILED
    assert refused.stderr.startswith("unauthorized: ")
    for result in (
        run([*status, "--api-key", KEY_A], env=without_key),
        run(status, env={**without_key, "STREAMPOOL_API_KEY": KEY_A}),
    ):
        assert result.returncode == EXIT_OK, result.stderr
        assert json.loads(result.stdout)["id"] == job_id
    # Another key's job is as unknown as a job that never was.
    foreign = run([*status, "--api-key", KEY_B], env=without_key)
    assert foreign.returncode == EXIT_FAILED
    assert foreign.stderr.startswith("not_found: ")


def test_no_gateway_is_an_unreachable_error() -> None:
    result = run([*STREAMPOOL, "status", "0" * 32, "--url", f"http://127.0.0.1:{free_port()}"])
    assert result.returncode == EXIT_FAILED
    assert result.stderr.startswith("unreachable: ")


def test_an_invalid_option_is_a_usage_error_before_anything_is_sent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"  # were anything sent, the error would be `unreachable`
    with pytest.raises(SystemExit) as exit_info:
        main(["submit", "Hello", "--temperature", "5", "--url", closed])
    assert exit_info.value.code == EXIT_USAGE
    assert capsys.readouterr().err.startswith("validation: temperature: ")


def test_system_option_sends_a_chat_with_the_system_message_first() -> None:
    args = build_parser().parse_args(
        ["submit", "Hi", "--system", "Be brief.", "--stop", "a", "--stop", "b", "--max-tokens", "5"]
    )
    request = job_request(args)
    assert request == JobRequest.model_validate(
        {
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "stop": ["a", "b"],
            "max_tokens": 5,
        }
    )
    assert request.model_fields_set == {"messages", "stop", "max_tokens"}  # the gateway's defaults apply


def test_chat_flag_sends_the_prompt_as_one_user_message_instead_of_a_prompt() -> None:
    parser = build_parser()
    assert job_request(parser.parse_args(["submit", "Hi"])).prompt == "Hi"
    chat = job_request(parser.parse_args(["submit", "Hi", "--chat"]))
    assert chat.prompt is None and chat.messages == [ChatMessage(role="user", content="Hi")]
