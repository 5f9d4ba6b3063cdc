"""The Files API's bounds through a real gateway process on a Redis of its own (whose command counts
are the gateway's alone): the upload's form, each key's and tenant's files, their expiry, and the
listing by purpose; with the `openai` package where a client's shape is the subject, raw HTTP where a
form's own bytes are."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import redis

from tests.gateway.keyed_gateway import KeyedGateway, bearer, run_gateway
from tests.helpers import eventually_sync
from tests.processes import Processes, free_port

KEYS = {name: f"sk-{name}-{uuid.uuid4().hex}" for name in ("form", "count", "bytes", "expiry", "listing")}
TEAM = [f"sk-team-{n}-{uuid.uuid4().hex}" for n in range(2)]
KEYS_FILE = (
    '[[tenants]]\nname = "team"\n\n'
    + "".join(f'[[keys]]\nkey = "{key}"\ntenant = "team"\n\n' for key in TEAM)
    + "".join(f'[[keys]]\nkey = "{key}"\n\n' for key in KEYS.values())
)
MAX_FILES = 20  # of a key
MAX_BYTES = 4096  # of a key's files
TENANT_FILES = 30
MAX_FORM = 65_536  # max_body_bytes: the form beside the file
LINE = b'{"custom_id": "a"}\n'
BOUNDARY = "sp-boundary"


@pytest.fixture(scope="module")
def files_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedGateway]:
    folder = tmp_path_factory.mktemp("files-gateway")
    processes = Processes(folder)
    url = processes.start_redis("files-redis", free_port(), folder / "redis", "--appendonly", "no")
    keys_file = folder / "keys.toml"
    keys_file.write_text(KEYS_FILE)
    try:
        yield from run_gateway(
            url,
            folder,
            api_keys_file=keys_file,
            files_dir=folder / "files",
            max_body_bytes=MAX_FORM,
            files_max_per_key=MAX_FILES,
            files_max_bytes_per_key=MAX_BYTES,
            files_max_per_tenant=TENANT_FILES,
            files_sweep_seconds=0.2,
        )
    finally:
        processes.stop_all()


def client(gateway: KeyedGateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key, max_retries=0)


def stored(gateway: KeyedGateway) -> set[str]:
    """The names of the files in the gateway's file storage."""
    return {path.name for path in Path(gateway.settings.files_dir).iterdir()}


def form(*parts: tuple[list[str], bytes]) -> bytes:
    """A multipart body of `parts`, each its header lines and its bytes."""
    body = b"".join(
        f"--{BOUNDARY}\r\n".encode()
        + "".join(f"{line}\r\n" for line in headers).encode()
        + b"\r\n"
        + data
        + b"\r\n"
        for headers, data in parts
    )
    return body + f"--{BOUNDARY}--\r\n".encode()


def post_form(gateway: KeyedGateway, key: str, body: bytes) -> httpx.Response:
    headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}", **bearer(key)}
    return httpx.post(f"{gateway.base_url}/v1/files", content=body, headers=headers, timeout=30)


FILE_PART = (['Content-Disposition: form-data; name="file"; filename="in.jsonl"'], LINE)
PURPOSE_PART = (['Content-Disposition: form-data; name="purpose"'], b"batch")


def test_a_part_whose_content_type_comes_before_its_disposition_is_read(files_gateway: KeyedGateway) -> None:
    file_part = (["Content-Type: application/jsonl", *FILE_PART[0]], LINE)
    purpose_part = (["Content-Type: text/plain", *PURPOSE_PART[0]], b"batch")
    answer = post_form(files_gateway, KEYS["form"], form(file_part, purpose_part))
    assert answer.status_code == 200, answer.text
    made = client(files_gateway, KEYS["form"]).files.retrieve(answer.json()["id"])
    assert (made.filename, made.purpose, made.bytes) == ("in.jsonl", "batch", len(LINE))


def test_fields_the_upload_does_not_read_are_passed_over_whatever_their_length(
    files_gateway: KeyedGateway,
) -> None:
    extra = [([f'Content-Disposition: form-data; name="note{n}"'], b"x" * 4096) for n in range(8)]
    answer = post_form(files_gateway, KEYS["form"], form(FILE_PART, *extra, PURPOSE_PART))
    assert answer.status_code == 200, answer.text
    assert answer.json()["bytes"] == len(LINE)


def test_a_form_whose_fields_pass_max_body_bytes_is_refused_and_nothing_is_kept(
    files_gateway: KeyedGateway,
) -> None:
    listed = {file.id for file in client(files_gateway, KEYS["form"]).files.list()}
    before = stored(files_gateway)
    fields = [
        ([f'Content-Disposition: form-data; name="f{n}"'], b"x" * 100) for n in range(2 * MAX_FORM // 100)
    ]
    answer = post_form(files_gateway, KEYS["form"], form(FILE_PART, PURPOSE_PART, *fields))
    assert answer.status_code == 413, answer.text
    assert "max_body_bytes" in answer.json()["error"]["message"]
    assert {file.id for file in client(files_gateway, KEYS["form"]).files.list()} == listed
    assert stored(files_gateway) == before


def test_a_key_holds_at_most_its_number_of_files_and_a_deleted_one_makes_room(
    files_gateway: KeyedGateway,
) -> None:
    files = client(files_gateway, KEYS["count"])
    made = [files.files.create(file=("in.jsonl", LINE), purpose="batch") for _ in range(MAX_FILES)]
    before = stored(files_gateway)
    with pytest.raises(openai.RateLimitError) as refused:
        files.files.create(file=("in.jsonl", LINE), purpose="batch")
    assert "files_max_per_key" in refused.value.message
    assert stored(files_gateway) == before
    assert len(files.files.list().data) == MAX_FILES
    files.files.delete(made[0].id)
    assert files.files.create(file=("in.jsonl", LINE), purpose="batch").bytes == len(LINE)


def test_a_key_holds_at_most_its_bytes_of_files_and_a_refused_upload_leaves_no_bytes(
    files_gateway: KeyedGateway,
) -> None:
    files = client(files_gateway, KEYS["bytes"])
    kept = files.files.create(file=("in.jsonl", LINE * (3000 // len(LINE))), purpose="batch")
    before = stored(files_gateway)
    with pytest.raises(openai.RateLimitError) as refused:
        files.files.create(file=("in.jsonl", LINE * (2000 // len(LINE))), purpose="batch")
    assert "files_max_bytes_per_key" in refused.value.message
    assert stored(files_gateway) == before
    assert [file.id for file in files.files.list()] == [kept.id]


def test_the_keys_of_a_tenant_hold_at_most_its_number_of_files(files_gateway: KeyedGateway) -> None:
    first, second = (client(files_gateway, key) for key in TEAM)
    for _ in range(MAX_FILES):
        first.files.create(file=("in.jsonl", LINE), purpose="batch")
    for _ in range(TENANT_FILES - MAX_FILES):
        second.files.create(file=("in.jsonl", LINE), purpose="batch")
    with pytest.raises(openai.RateLimitError) as refused:
        second.files.create(file=("in.jsonl", LINE), purpose="batch")
    assert "files_max_per_tenant" in refused.value.message
    assert len(second.files.list().data) == TENANT_FILES - MAX_FILES


def test_expires_after_is_taken_as_the_openai_package_sends_it(files_gateway: KeyedGateway) -> None:
    files = client(files_gateway, KEYS["expiry"])
    made = files.files.create(
        file=("in.jsonl", LINE), purpose="batch", expires_after={"anchor": "created_at", "seconds": 3600}
    )
    assert made.expires_at == made.created_at + 3600
    assert files.files.retrieve(made.id).expires_at == made.expires_at
    with pytest.raises(openai.BadRequestError):
        files.files.create(
            file=("in.jsonl", LINE), purpose="batch", expires_after={"anchor": "created_at", "seconds": 60}
        )


def test_an_expired_file_is_gone_from_reads_listings_and_storage(files_gateway: KeyedGateway) -> None:
    files = client(files_gateway, KEYS["expiry"])
    kept = files.files.create(file=("in.jsonl", LINE), purpose="batch")
    expiring = [
        files.files.create(
            file=("in.jsonl", LINE), purpose="batch", expires_after={"anchor": "created_at", "seconds": 3600}
        )
        for _ in range(2)
    ]
    # An hour is the shortest life a client may ask for: the test moves the files' hour into the past.
    keys = files_gateway.keys
    with redis.Redis.from_url(files_gateway.settings.redis_url) as direct:
        for made in expiring:
            past = int(time.time()) - 1
            direct.hset(keys.file(made.id), "expires_at", past)
            direct.zadd(keys.files_expiring, {made.id: past})
    read, unread = expiring
    with pytest.raises(openai.NotFoundError):
        files.files.retrieve(read.id)
    assert read.id not in stored(files_gateway)  # the read removed it
    listed = {file.id for file in files.files.list()} | {
        file.id for file in files.files.list(purpose="batch")
    }
    assert kept.id in listed and not listed & {read.id, unread.id}
    eventually_sync(lambda: unread.id not in stored(files_gateway), "the sweeper removes the unread file")
    with pytest.raises(openai.NotFoundError):
        files.files.content(unread.id)


def hgetalls(direct: redis.Redis) -> int:
    """How many HGETALLs the Redis has run: the gateway's reads of file records."""
    stats: dict[str, dict[str, int]] = direct.info("commandstats")  # type: ignore[assignment]
    return int(stats.get("cmdstat_hgetall", {}).get("calls", 0))


def test_a_page_filtered_by_purpose_reads_no_more_files_than_an_unfiltered_one(
    files_gateway: KeyedGateway,
) -> None:
    files = client(files_gateway, KEYS["listing"])
    made = [files.files.create(file=("in.jsonl", LINE), purpose="batch") for _ in range(MAX_FILES)]
    with redis.Redis.from_url(files_gateway.settings.redis_url) as direct:
        reads = []
        for purpose in (openai.NOT_GIVEN, "batch"):
            before = hgetalls(direct)
            page = files.files.list(limit=1, purpose=purpose)  # type: ignore[arg-type]
            reads.append(hgetalls(direct) - before)
            assert ([file.id for file in page.data], page.has_more) == ([made[-1].id], True)
    assert reads[1] == reads[0] <= 2
    assert files.files.list(purpose="batch_output").data == []
    ascending = [file.id for file in files.files.list(purpose="batch", order="asc", limit=7)]
    assert ascending == [file.id for file in made]
