"""How `-n` (`make test-fast`) deals the tests out to its test processes: one at a time, but for the
modules of a group, whose tests all run in one process, and in an order that starts the long runs first.

A group's process then sets up once what the group's modules share, where every process that ran one
of their tests would set it up again otherwise: seconds of CPU on a 2-core machine that runs four test
processes. (xdist's own `--dist loadgroup` marks cannot serve: they rename tests, which this pytest no
longer allows, and xdist takes them silently.)
"""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadScopeScheduling

GROUPS = {
    "tests/faults/test_sentinel_failover.py": "sentinel-failover",  # its Redis, Sentinels and deployment
    "tests/faults/test_redis_outage.py": "redis-outage",  # its Redis, gateway and worker
    "tests/faults/test_worker_crash.py": "synthetic-pool",  # tests/faults/conftest.py's `synthetic_pool`
    "tests/faults/test_worker_drain.py": "synthetic-pool",
    "tests/faults/test_runtime_adapters.py": "synthetic-pool",
    "tests/faults/test_kept_answers.py": "synthetic-pool",
    "tests/shared/test_redis_cluster_client.py": "redis-cluster",  # tests/conftest.py's `redis_cluster`
    "tests/shared/test_streams_on_cluster.py": "streams-on-cluster",  # a `redis_cluster` of its own
    "tests/fuzz/test_schema_fuzz.py": "fuzz",  # its gateway process and the schema read from it
    "tests/worker/test_sampling_params.py": "engine-libraries",  # imports vLLM
    "tests/worker/test_replies.py": "engine-libraries",
    "tests/worker/test_synthetic_pooling.py": "engine-libraries",  # imports vLLM's protocol models
    "tests/gateway/test_pooling_compat.py": "engine-libraries",  # imports vLLM's protocol models
    "tests/worker/test_cpu_dtype.py": "engine-libraries",  # imports torch
    "tests/worker/test_engine_arguments.py": "engine-libraries",  # vLLM's argument parser
    "tests/cli/test_worker_engine_flags.py": "engine-libraries",  # vLLM's argument parser
    "tests/gateway/test_chat_tools.py": "engine-libraries",  # imports vLLM's protocol models
    "tests/gateway/test_openai_compat.py": "engine-libraries",  # imports vLLM's protocol models
    "tests/shared/test_scheduling.py": "engine-libraries",  # imports vLLM's block hashing
    "tests/worker/test_constraint_compile.py": "engine-libraries",  # its child imports xgrammar (torch)
    "tests/gateway/test_vllm_routes.py": "engine-libraries",  # loads the tokenizer with transformers
    "tests/gateway/test_scale_out_compat.py": "engine-libraries",  # imports vLLM's protocol models
    "tests/gateway/test_scale_out_routes.py": "engine-libraries",
    "tests/gateway/test_adapter_routes.py": "engine-libraries",  # imports vLLM's protocol models
    "tests/gateway/test_auth.py": "keyed",  # tests/conftest.py's `keyed` gateway process
    "tests/gateway/test_responses_routes.py": "keyed",
    "tests/gateway/test_stored_chat_owners.py": "keyed",
    "tests/gateway/test_resume_routes.py": "keyed",
    "tests/cli/test_client_commands.py": "keyed",
    "tests/e2e/test_playground.py": "keyed",
    "tests/e2e/test_console.py": "keyed",
    "tests/gateway/test_readers.py": "gateway-process",  # tests/gateway/conftest.py's `gateway_process`
    "tests/gateway/test_reader_cursors.py": "gateway-process",
    "tests/gateway/test_structured_outputs.py": "gateway-process",
    "tests/gateway/test_deadlines.py": "gateway-process",
    "tests/gateway/test_openai_stream_timing.py": "stream-timing",  # a gateway process of its own
    "tests/gateway/test_reader_bounds.py": "stream-limits",  # a gateway process of its own
    "tests/gateway/test_tenants.py": "tenants",  # a gateway process of its own
    "tests/gateway/test_files.py": "files",  # its Redis and gateway process
    "tests/scale/test_many_processes.py": "scale",  # gateways and synthetic workers of its own
    "tests/e2e/test_synthetic_worker.py": "synthetic-system",  # tests/conftest.py's `synthetic_system`
    "tests/e2e/test_replay.py": "synthetic-system",
    "tests/e2e/test_openai_routes.py": "synthetic-system",
    "tests/e2e/test_scale_out_routes.py": "synthetic-system",
    "tests/e2e/test_tgi_routes.py": "synthetic-system",
    "tests/e2e/test_openai_stream_timing.py": "synthetic-system",
    "tests/e2e/test_responses_client.py": "synthetic-system",
    "tests/e2e/test_responses_compliance.py": "synthetic-system",
    "tests/e2e/test_stored_chat_completions.py": "synthetic-system",
    "tests/e2e/test_workers.py": "synthetic-system",
    "tests/faults/test_deadline.py": "synthetic-system",
    "tests/faults/test_gateway_shutdown.py": "synthetic-system",
    "tests/gateway/test_client_refusals.py": "client-refusals",  # a gateway process of its own
    "tests/e2e/test_models.py": "models",  # a gateway and synthetic workers of its own
    "tests/e2e/test_agents.py": "agents",  # a gateway and scripted synthetic workers, and a pool, of its own
    "tests/e2e/test_batches.py": "batches",  # gateways and a synthetic worker of its own
    "tests/e2e/test_streams_apart.py": "streams-apart",  # its streams' Redis, gateway and synthetic workers
    "tests/e2e/test_streams_on_cluster.py": "streams-on-cluster-e2e",  # its cluster, gateways and workers
    "tests/e2e/test_pooling.py": "pooling-engines",  # its embedding pool and vLLM's server, one engine each
}
"""Each module's group: what the comment names is set up once per group, not once per process."""


ENGINES_FIRST = ["tests/e2e/test_pooling.py", "tests/e2e/test_beside_vllm_server.py"]
"""In one process on the real engine (`make test`'s `-m system`), the modules that start engines of
their own (for a module: an embedding pool and vLLM's server; vLLM's server beside the session's
deployment) go first, in this order, each stopping its own before the next starts: a real worker
holds about 3 GiB, and with the session's `system` and `pool` alive too, the machine would hold six."""


def engines_first(item: pytest.Item) -> int:
    """Where a test on the real engine goes when one process runs them all (ENGINES_FIRST)."""
    path = _path(item.nodeid)
    return ENGINES_FIRST.index(path) if path in ENGINES_FIRST else len(ENGINES_FIRST)


def _path(nodeid: str) -> str:
    return nodeid.split("::")[0]


def rank(item: pytest.Item) -> int:
    """Where a test goes in the order of dealing: the groups first (each is one long run), in GROUPS'
    order, then the rest, so that short tests fill the processes at the end."""
    groups = list(dict.fromkeys(GROUPS.values()))
    group = GROUPS.get(_path(item.nodeid))
    return groups.index(group) if group else len(groups)


class GroupScheduling(LoadScopeScheduling):
    """xdist's scheduling by scope, with a group (GROUPS) or else the test itself as the scope, dealt
    out in the order of the collection, which tests/conftest.py sorts by `rank`."""

    def __init__(self, config: pytest.Config, log: object = None) -> None:
        super().__init__(config, log)  # type: ignore[arg-type]
        config.option.loadscopereorder = False  # else the largest scopes would go first

    def _split_scope(self, nodeid: str) -> str:
        return GROUPS.get(_path(nodeid), nodeid)
