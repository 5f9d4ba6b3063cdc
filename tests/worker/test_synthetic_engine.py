"""The synthetic engine on the default model's tokenizer: what it honours of a request, and abort."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from shared.config import DEFAULT_MODEL_DIR, WorkerSettings
from shared.errors import EngineError
from shared.requests import ChatMessage, JobRequest
from worker.engine import EngineDelta, Prompt, abort, generate, render
from worker.synthetic_engine import SCRIPT_AFTER_TOOL, SyntheticEngine, next_step_at, read_model_card

STEP_SECONDS = 0.001


@pytest.fixture(scope="module")
def engine() -> SyntheticEngine:
    if not DEFAULT_MODEL_DIR.is_dir():
        pytest.skip("the default model is not prepared (make setup)")
    settings = WorkerSettings(engine="synthetic", synthetic_step_seconds=STEP_SECONDS, max_model_len=64)
    return SyntheticEngine(settings, read_model_card(settings.model, settings.model_name, 64))


async def run(engine: SyntheticEngine, request: JobRequest, request_id: str = "r") -> list[EngineDelta]:
    return [delta async for delta in engine.generate(request_id, engine.render(request))]


async def run_all(engine: SyntheticEngine, requests: list[JobRequest]) -> list[list[EngineDelta]]:
    """Each request's deltas, the requests run at once under ids of their own."""
    return list(await asyncio.gather(*(run(engine, request, f"r{n}") for n, request in enumerate(requests))))


def choice(deltas: list[EngineDelta], index: int = 0) -> tuple[list[int], str, str | None]:
    mine = [delta for delta in deltas if delta.index == index]
    ids = [token for delta in mine for token in delta.token_ids]
    return ids, "".join(delta.text for delta in mine), mine[-1].finish_reason


async def test_the_same_seed_gives_the_same_tokens_and_max_tokens_ends_with_length(
    engine: SyntheticEngine,
) -> None:
    request = JobRequest(prompt="Hello", max_tokens=12, seed=7, ignore_eos=True)
    first, second = await run(engine, request), await run(engine, request)
    ids, text, reason = choice(first)
    assert ids == choice(second)[0]
    assert len(ids) == 12 and reason == "length" and text
    assert ids != choice(await run(engine, request.model_copy(update={"seed": 8})))[0]
    with_logprobs = await run(engine, request.model_copy(update={"logprobs": 2}))
    assert choice(with_logprobs)[0] == ids  # asking for logprobs changes no token
    assert all(len(delta.logprobs or []) == len(delta.token_ids) for delta in with_logprobs)


async def test_a_greedy_request_without_a_seed_gives_the_same_answer_for_the_same_prompt(
    engine: SyntheticEngine,
) -> None:
    greedy = JobRequest(prompt="Hello", max_tokens=8, temperature=0, ignore_eos=True)
    assert choice(await run(engine, greedy))[0] == choice(await run(engine, greedy))[0]
    other = greedy.model_copy(update={"prompt": "Goodbye"})
    assert choice(await run(engine, other))[0] != choice(await run(engine, greedy))[0]


async def test_every_choice_of_n_streams_apart(engine: SyntheticEngine) -> None:
    deltas = await run(engine, JobRequest(prompt="Hello", max_tokens=5, n=3, seed=1, ignore_eos=True))
    choices = [choice(deltas, index) for index in range(3)]
    assert all(len(ids) == 5 and reason == "length" for ids, _, reason in choices)
    assert len({tuple(ids) for ids, _, _ in choices}) == 3
    assert sum(delta.finished for delta in deltas) == 3


async def test_a_stop_string_cuts_the_text_and_ends_the_choice(engine: SyntheticEngine) -> None:
    request = JobRequest(prompt="Hello", max_tokens=40, seed=3, ignore_eos=True)
    _, text, _ = choice(await run(engine, request))
    stop = text[10:13]  # three characters from the middle of what this seed writes
    stopped = await run(engine, request.model_copy(update={"stop": stop}))
    ids, cut, reason = choice(stopped)
    assert reason == "stop" and stop not in cut and text.startswith(cut) and len(ids) < 40
    assert stopped[-1].stop_reason == stop  # vLLM's stop_reason: the string that ended it
    kept = request.model_copy(update={"stop": stop, "include_stop_str_in_output": True})
    assert choice(await run(engine, kept))[1].endswith(stop)


async def test_a_stop_token_id_ends_the_choice(engine: SyntheticEngine) -> None:
    request = JobRequest(prompt="Hello", max_tokens=30, seed=5, ignore_eos=True)
    ids, _, _ = choice(await run(engine, request))
    stopped = await run(engine, request.model_copy(update={"stop_token_ids": [ids[4]]}))
    assert choice(stopped)[0] == ids[: ids.index(ids[4]) + 1] and choice(stopped)[2] == "stop"
    assert stopped[-1].stop_reason == ids[4]


async def test_without_ignore_eos_a_choice_may_end_with_the_end_of_sequence(engine: SyntheticEngine) -> None:
    # 64 requests of up to 60 tokens each end early with about 1 - (255/256)^60 = 21 % each. They run at
    # once, as a batch: one after the other, their steps add up to seconds.
    requests = [JobRequest(prompt="Hi", max_tokens=60, seed=seed) for seed in range(64)]
    ends = [choice(deltas) for deltas in await run_all(engine, requests)]
    eos = engine.card.special_tokens["eos_token"]
    stopped = [ids for ids, _, reason in ends if reason == "stop"]
    assert stopped and all(ids[-1] == engine._counter.token_id(str(eos)) for ids in stopped)
    assert not any(str(eos) in text for _, text, _ in ends)  # skipped in the text, as vLLM does
    ignoring = [request.model_copy(update={"ignore_eos": True}) for request in requests]
    ignored = [choice(deltas) for deltas in await run_all(engine, ignoring)]
    assert all(reason == "length" and len(ids) == 60 for ids, _, reason in ignored)


async def test_abort_ends_a_running_request_with_abort(engine: SyntheticEngine) -> None:
    request = JobRequest(prompt="Hello", max_tokens=10_000, ignore_eos=True)
    seen: list[EngineDelta] = []

    async def consume() -> None:
        async for delta in engine.generate("long", engine.render(request)):
            seen.append(delta)

    task = asyncio.create_task(consume())
    while len(seen) < 3:
        await asyncio.sleep(STEP_SECONDS)
    assert engine.running_requests() == 1
    await engine.abort("long")
    await asyncio.wait_for(task, 5)
    assert seen[-1].finished and seen[-1].finish_reason == "abort"
    assert engine.running_requests() == 0


async def test_generation_stops_at_the_context_and_a_prompt_that_fills_it_is_refused(
    engine: SyntheticEngine,
) -> None:
    prompt = engine.render(JobRequest(prompt="Hello there", max_tokens=1000, ignore_eos=True))
    ids, _, reason = choice(await run(engine, prompt.request))
    assert reason == "length" and len(prompt.token_ids) + len(ids) == engine.max_model_len
    with pytest.raises(EngineError):
        await run(engine, JobRequest(prompt="word " * 200, max_tokens=1))


def test_chats_render_through_the_model_s_template(engine: SyntheticEngine) -> None:
    prompt = engine.render(JobRequest(messages=[ChatMessage(role="user", content="Hi")], max_tokens=1))
    assert "<|im_start|>user" in engine._counter.decode(prompt.token_ids)


def test_token_ids_are_the_prompt_as_given_and_unknown_ones_are_refused(engine: SyntheticEngine) -> None:
    ids = [504, 3575, 282]
    assert engine.render(JobRequest(prompt_token_ids=ids)).token_ids == ids  # no BOS added, none dropped
    kept = JobRequest(prompt_token_ids=ids, truncate_prompt_tokens=2)
    assert engine.render(kept).token_ids == ids[1:]
    with pytest.raises(EngineError, match="49152"):
        engine.render(JobRequest(prompt_token_ids=[1, 49152]))


async def test_several_prompts_run_apart_and_number_their_choices_as_vllm(engine: SyntheticEngine) -> None:
    """Prompt i's choice j is choice i * n + j; each prompt gets the answer it gets alone."""
    greedy = JobRequest(prompt_token_ids=[[504, 3575], [282], [504]], max_tokens=4, temperature=0)
    prompts = await render(engine, greedy)
    assert [prompt.token_ids for prompt in prompts] == [[504, 3575], [282], [504]]
    deltas = [delta async for delta in generate(engine, "batch", prompts)]
    answers = [choice(deltas, index)[0] for index in range(3)]
    assert answers == [choice(await run(engine, alone))[0] for alone in greedy.each_prompt()]
    assert len({tuple(answer) for answer in answers}) == 3
    sampled = JobRequest(prompt=["Hello", "Goodbye"], n=2, max_tokens=4, ignore_eos=True)
    deltas = [delta async for delta in generate(engine, "sampled", await render(engine, sampled))]
    assert all(len(choice(deltas, index)[0]) == 4 for index in range(4))
    assert {delta.index for delta in deltas} == {0, 1, 2, 3}


async def test_abort_of_a_job_of_several_prompts_ends_every_request(engine: SyntheticEngine) -> None:
    request = JobRequest(prompt=["Hello", "Goodbye"], max_tokens=10_000, ignore_eos=True)
    prompts = await render(engine, request)
    seen: list[EngineDelta] = []

    async def consume() -> None:
        async for delta in generate(engine, "both", prompts):
            seen.append(delta)

    task = asyncio.create_task(consume())
    while len(seen) < 6:
        await asyncio.sleep(STEP_SECONDS)
    assert engine.running_requests() == 2
    await abort(engine, "both", len(prompts))
    await asyncio.wait_for(task, 5)
    assert {delta.index for delta in seen if delta.finish_reason == "abort"} == {0, 1}
    assert engine.running_requests() == 0


@pytest.mark.parametrize(
    ("now", "fires_at"),
    [
        (10.01, 10.03),  # the waiters took 10 ms over their outputs: the step keeps its period
        (10.03, 10.03),
        (10.05, 10.05),  # 20 ms late (a worker slower than its engine): at once
        (10.07, 10.10),  # idle for longer than two periods: a whole step from now
    ],
)
def test_steps_keep_a_fixed_period_whatever_their_waiters_take(now: float, fires_at: float) -> None:
    assert next_step_at(10.0, now, 0.03) == pytest.approx(fires_at)


SCRIPT = (
    "<think>I should look it up.</think>"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
ANSWER = "It is sunny in Paris."


@pytest.fixture(scope="module")
def scripted() -> SyntheticEngine:
    if not DEFAULT_MODEL_DIR.is_dir():
        pytest.skip("the default model is not prepared (make setup)")
    settings = WorkerSettings(
        engine="synthetic",
        synthetic_step_seconds=STEP_SECONDS,
        max_model_len=256,
        synthetic_script=f"{SCRIPT}{SCRIPT_AFTER_TOOL}{ANSWER}",
    )
    return SyntheticEngine(settings, read_model_card(settings.model, settings.model_name, 256))


def chat(*messages: ChatMessage, **options: object) -> JobRequest:
    return JobRequest.model_validate({"messages": list(messages), "max_tokens": 200, **options})


USER = ChatMessage(role="user", content="What is the weather in Paris?")


async def test_a_script_is_emitted_a_token_a_step_then_the_end_of_sequence(scripted: SyntheticEngine) -> None:
    """Every choice writes the script, one token a delta, and ends with the end of sequence, which is
    not in the text even where special tokens are kept (as vLLM's detokenizer leaves it out)."""
    deltas = await run(scripted, chat(USER, n=2, skip_special_tokens=False))
    script_ids = scripted._counter.encode(SCRIPT, add_special_tokens=False)
    eos = scripted._counter.token_id(str(scripted.card.special_tokens["eos_token"]))
    for index in range(2):
        ids, text, reason = choice(deltas, index)
        assert ids == [*script_ids, eos] and text == SCRIPT and reason == "stop"
        assert all(len(delta.token_ids) == 1 for delta in deltas if delta.index == index)


async def test_a_chat_after_a_tool_s_result_gets_the_script_s_second_part(scripted: SyntheticEngine) -> None:
    called = ChatMessage.model_validate(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
            ],
        }
    )
    result = ChatMessage(role="tool", content="sunny", tool_call_id="call_1")
    assert choice(await run(scripted, chat(USER, called, result)))[1] == ANSWER
    assert choice(await run(scripted, chat(USER, called, result, USER)))[1] == SCRIPT
    assert choice(await run(scripted, JobRequest(prompt="Hi", max_tokens=200)))[1] == SCRIPT


async def test_a_script_honours_max_tokens_stops_and_ignore_eos(scripted: SyntheticEngine) -> None:
    ids, text, reason = choice(await run(scripted, chat(USER, max_tokens=5)))
    assert len(ids) == 5 and reason == "length" and SCRIPT.startswith(text)
    stopped = await run(scripted, chat(USER, stop=["</think>"]))
    assert choice(stopped)[1:] == ("<think>I should look it up.", "stop")
    assert stopped[-1].stop_reason == "</think>"
    script_ids = scripted._counter.encode(SCRIPT, add_special_tokens=False)
    ids, text, reason = choice(await run(scripted, chat(USER, stop_token_ids=[script_ids[3]])))
    assert ids == script_ids[:4] and reason == "stop"
    assert text == scripted._counter.decode(script_ids[:3])  # the stop token left out, as vLLM does
    ids, text, reason = choice(
        await run(scripted, chat(USER, max_tokens=len(script_ids) + 5, ignore_eos=True))
    )
    assert ids[: len(script_ids)] == script_ids and len(ids) == len(script_ids) + 5 and reason == "length"


async def test_a_resumed_job_goes_on_with_the_script_where_its_last_run_stopped(
    scripted: SyntheticEngine,
) -> None:
    request = chat(USER)
    script_ids = scripted._counter.encode(SCRIPT, add_special_tokens=False)
    resumed = scripted.render(request).continued(script_ids[:7])
    ids, text, reason = choice([delta async for delta in scripted.generate("resumed", resumed)])
    assert ids[:-1] == script_ids[7:] and reason == "stop"
    assert scripted._counter.decode(script_ids[:7]) + text == SCRIPT


@pytest.mark.parametrize("given_as", ["file", "text"])
def test_a_pools_chat_template_replaces_the_tokenizers_in_its_card_and_its_prompts(
    given_as: str, tmp_path: Path
) -> None:
    """`--chat-template` as `vllm serve` reads it (vLLM's own loader): a file or the template itself."""
    if not DEFAULT_MODEL_DIR.is_dir():
        pytest.skip("the default model is not prepared (make setup)")
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]"
    path = tmp_path / "template.jinja"
    path.write_text(template)
    settings = WorkerSettings(
        engine="synthetic", max_model_len=64, chat_template=str(path) if given_as == "file" else template
    )
    engine = SyntheticEngine(settings, read_model_card(settings.model, settings.model_name, 64))
    assert engine.card.chat_template == engine.chat_template == template
    prompt = engine.render(JobRequest(messages=[ChatMessage(role="user", content="Hi")], max_tokens=1))
    assert engine._counter.decode(prompt.token_ids) == "[user] Hi\n[assistant]"


def test_a_chat_template_file_that_cannot_be_read_ends_the_start_with_vllms_message() -> None:
    if not DEFAULT_MODEL_DIR.is_dir():
        pytest.skip("the default model is not prepared (make setup)")
    settings = WorkerSettings(engine="synthetic", max_model_len=64, chat_template="/no/such/template.jinja")
    with pytest.raises(EngineError, match="--chat-template: The supplied chat template"):
        SyntheticEngine(settings, read_model_card(settings.model, settings.model_name, 64))


async def test_a_job_asking_for_its_prompt_back_gets_it_on_its_first_delta_only(
    engine: SyntheticEngine,
) -> None:
    """A text prompt as it was given, token ids decoded (special tokens kept), and the first token's
    text; a resumed run, whose first run gave it, does not give it again."""
    ids = engine.render(JobRequest(prompt="Hello there")).token_ids
    for given in ({"prompt": "Hello there"}, {"prompt_token_ids": ids}):
        request = JobRequest(**given, max_tokens=3, ignore_eos=True, echo=True)
        deltas = await run(engine, request)
        echo = deltas[0].echo
        assert echo is not None and [delta.echo for delta in deltas[1:]] == [None, None]
        assert echo.text == "Hello there" and "Hello there".startswith(echo.first_token) and echo.first_token
        prompt = engine.render(request).continued([5])
        assert [delta.echo for delta in await generated(engine, prompt)] == [None, None]
    assert (await run(engine, JobRequest(prompt="Hello there", max_tokens=1)))[0].echo is None


async def generated(engine: SyntheticEngine, prompt: Prompt) -> list[EngineDelta]:
    return [delta async for delta in engine.generate("resumed", prompt)]
