"""The batched engine writes, for every request, exactly what single-sequence greedy
decoding writes: at every batch size, with requests of mixed prompt lengths and budgets
joining and leaving between rounds, in self-speculative and in AR mode.

Everything runs in float64 (conftest's `trained_tiny_model`): random and briefly trained
tiny models have nearly tied logits, and a batched pass sums in a different order than a
single-sequence one (other matrix shapes, padded keys), so in float32 a 1e-7 difference
could flip an argmax between two near-equal logits. In float64 such noise is ~1e-16, so
a mismatch here means the engine's logic is wrong, not the arithmetic.
"""

from __future__ import annotations

import threading

import pytest
import torch
from transformers.cache_utils import DynamicCache

from gravityocr.model.decode.attention import causal_attention_mask
from gravityocr.model.decode.reference import greedy_decode, prefill, speculative_decode
from gravityocr.model.engine import CacheTooLarge, Engine, EngineConfig, Request, RequestTooLong
from gravityocr.model.engine.scheduler import PREFILL_PADDING, prefill_groups

from conftest import random_image

REFERENCE_MAX_NEW = 64  # greedy output for any max_new_tokens <= this is a prefix of it
MAX_NEW_CYCLE = [64, 7, 1, 2, 33, 25, 48, 18, 60, 3, 40, 11, 64]  # lengths 13: coprime with the pool
IMAGE_SIZES = [(56, 56), (140, 28), (84, 84), (196, 56), (28, 112), (112, 84), (168, 28), (70, 42), (250, 60)]


@pytest.fixture(scope="module")
def model(trained_tiny_model):
    return trained_tiny_model


@pytest.fixture(scope="module")
def eos(tokenizer):
    return {tokenizer.eos_token_id}


@pytest.fixture(scope="module")
def prompt_pool(overfit_samples, processor):
    """Prompts of mixed lengths (different image sizes): the memorised ones, whose drafts
    are mostly accepted, and unseen images, whose drafts mostly are not."""
    tasks = ["text", "table", "formula"]
    unseen = [processor.encode(random_image(200 + i, w, h), tasks[i % 3]) for i, (w, h) in enumerate(IMAGE_SIZES)]
    return [s.prompt for s in overfit_samples] + unseen


@pytest.fixture(scope="module")
def greedy_outputs(model, prompt_pool, eos):
    return [greedy_decode(model, p, REFERENCE_MAX_NEW, eos).token_ids for p in prompt_pool]


def make_requests(count: int, prompt_pool, first: int = 0) -> list[tuple[Request, int]]:
    """`count` requests cycling through the pool and MAX_NEW_CYCLE; each with its pool index."""
    requests = []
    for i in range(first, first + count):
        index = (5 * i) % len(prompt_pool)  # 5 and the pool size 12 are coprime
        requests.append((Request(f"r{i}", prompt_pool[index], MAX_NEW_CYCLE[i % len(MAX_NEW_CYCLE)]), index))
    return requests


def expected(greedy_outputs, index: int, max_new_tokens: int) -> list[int]:
    return greedy_outputs[index][:max_new_tokens]


def engine_for(model, eos, tokenizer=None, **settings) -> Engine:
    config = EngineConfig(**{"dtype": torch.float64, "max_seq_len": 256, "num_threads": 1, **settings})
    return Engine(model, config, eos, tokenizer)


@pytest.mark.parametrize("batch_size,block_size", [(1, 8), (2, 32), (7, 8), (64, 32)])
def test_speculative_batches_equal_greedy(model, tokenizer, eos, prompt_pool, greedy_outputs, batch_size, block_size):
    engine = engine_for(model, eos, tokenizer, max_batch_size=batch_size, block_size=block_size)
    requests = make_requests(batch_size, prompt_pool)
    results = engine.generate([r for r, _ in requests])
    for (request, index), result in zip(requests, results):
        assert result.request_id == request.request_id
        assert result.token_ids == expected(greedy_outputs, index, request.max_new_tokens), request.request_id
        assert result.text == tokenizer.decode(result.token_ids, skip_special_tokens=True)
        assert result.stats.committed_tokens == len(result.token_ids)
    stats = engine.stats()
    assert stats.committed_tokens == sum(len(r.token_ids) for r in results)
    assert stats.forward_passes == sum(r.stats.forward_passes for r in results)
    assert (stats.batch_size, stats.waiting, stats.finished_requests) == (0, 0, batch_size)
    if batch_size == 64:  # the mix this test claims: drafts accepted, eos at different rounds, budgets hit
        assert sum(sum(r.stats.accepted_per_round) for r in results) > 0
        eos_lengths = {len(r.token_ids) for r in results if r.finish_reason == "eos"}
        assert len(eos_lengths) >= 3
        assert any(r.finish_reason == "length" for r in results)


@pytest.mark.parametrize("block_size", [8, 32])
def test_speculative_rounds_match_the_reference_round_for_round(model, eos, prompt_pool, block_size):
    """Same drafts, same acceptance, same pass count as `speculative_decode`: the batched
    draft pass gives every row exactly its own block's attention, also when a row's block
    is cut short by its budget while the others' are not. Fixed blocks, as the reference drafts."""
    engine = engine_for(model, eos, max_batch_size=13, block_size=block_size, adaptive_block=False)
    requests = make_requests(13, prompt_pool)
    for (request, _), result in zip(requests, engine.generate([r for r, _ in requests])):
        reference = speculative_decode(model, request.prompt, request.max_new_tokens, eos, block_size=block_size)
        assert result.token_ids == reference.token_ids
        assert result.stats.accepted_per_round == reference.stats.accepted_per_round
        assert result.stats.forward_passes == reference.stats.forward_passes


@pytest.mark.parametrize("batch_size", [7, 64])
def test_ar_mode_equals_greedy(model, eos, prompt_pool, greedy_outputs, batch_size):
    engine = engine_for(model, eos, max_batch_size=batch_size, mode="ar")
    requests = make_requests(batch_size, prompt_pool)
    for (request, index), result in zip(requests, engine.generate([r for r, _ in requests])):
        assert result.token_ids == expected(greedy_outputs, index, request.max_new_tokens)
        assert result.stats.forward_passes == len(result.token_ids)


def test_rounds_fit_a_slot_filled_to_the_last_token(model, eos, prompt_pool, greedy_outputs):
    """max_seq_len exactly the longest prompt + budget: the last rounds' draft masks and
    other rows' padding still fit the slots."""
    requests = make_requests(13, prompt_pool)
    longest = max(r.prompt.length + r.max_new_tokens for r, _ in requests)
    engine = engine_for(model, eos, max_batch_size=13, block_size=8, max_seq_len=longest)
    for (request, index), result in zip(requests, engine.generate([r for r, _ in requests])):
        assert result.token_ids == expected(greedy_outputs, index, request.max_new_tokens)


def test_a_full_batch_decodes_in_ar_rounds_and_stays_exact(model, eos, prompt_pool, greedy_outputs):
    """With speculative_max_batch, a few running sequences decode in speculative rounds and
    a full batch in AR rounds: sequences cross both ways (an AR round drops the drafts a
    prefill left; a speculative round after AR ones drafts afresh), newcomers admitted into
    a full batch are prefilled without drafts, and every output is still greedy's."""
    engine = engine_for(model, eos, max_batch_size=8, block_size=8, speculative_max_batch=3)
    first, later = make_requests(3, prompt_pool), make_requests(9, prompt_pool, first=3)
    for request, _ in first:
        engine.add_request(request)
    results, kinds = {}, []
    while engine.has_work():
        before = engine.stats()
        results.update((r.request_id, r) for r in engine.step())
        after = engine.stats()
        kinds.append("ar" if after.ar_rounds > before.ar_rounds else "spec")
        if len(kinds) == 2:
            for request, _ in later:
                engine.add_request(request)
    for request, index in first + later:
        result = results[request.request_id]
        assert result.token_ids == expected(greedy_outputs, index, request.max_new_tokens)
        # one pass per AR token, fewer per token in speculative rounds: never more passes than tokens
        assert result.stats.forward_passes <= result.stats.committed_tokens
        assert result.stats.ar_rounds <= kinds.count("ar")
    # every AR round counts in the stats of each sequence it ran, and the first newcomers into
    # the full batch (admitted in the AR round right after) ran some
    assert sum(r.stats.ar_rounds for r in results.values()) >= kinds.count("ar")
    assert results[later[0][0].request_id].stats.ar_rounds > 0
    assert kinds[:2] == ["spec", "spec"] and kinds[2] == "ar" and kinds[-1] == "spec"
    stats = engine.stats()
    assert 0 < stats.ar_rounds < stats.rounds == len(kinds)
    by_kind = stats.rounds_by_kind()
    assert sum(by_kind.values()) == stats.rounds and by_kind["ar"] == kinds.count("ar")
    assert by_kind == {"speculative": kinds.count("spec"), "ar": kinds.count("ar")}
    with pytest.raises(ValueError, match="speculative_max_batch must be at least 1"):
        EngineConfig(speculative_max_batch=0)


def test_a_cap_stops_speculating_above_it_and_the_default_speculates_at_any_batch():
    config = EngineConfig(speculative_max_batch=4)
    assert config.speculates(4) and not config.speculates(5)
    assert not EngineConfig(mode="ar").speculates(1) and EngineConfig().speculates(10_000)


def test_fixed_blocks_are_exact(model, eos, prompt_pool, greedy_outputs):
    engine = engine_for(model, eos, max_batch_size=16, block_size=32, adaptive_block=False)
    requests = make_requests(20, prompt_pool)
    for (request, index), result in zip(requests, engine.generate([r for r, _ in requests])):
        assert result.token_ids == expected(greedy_outputs, index, request.max_new_tokens)


def test_more_requests_than_slots_all_complete(model, eos, prompt_pool, greedy_outputs):
    engine = engine_for(model, eos, max_batch_size=3, block_size=8)
    requests = make_requests(10, prompt_pool)
    results = engine.generate([r for r, _ in requests])
    assert [r.request_id for r in results] == [r.request_id for r, _ in requests]
    for (request, index), result in zip(requests, results):
        assert result.token_ids == expected(greedy_outputs, index, request.max_new_tokens)
    assert engine.stats().finished_requests == 10


def test_prefill_passes_hold_prompts_of_similar_length(model, eos, prompt_pool, greedy_outputs):
    """Newcomers take slots longest prompt first and their prefill is cut into passes
    that pad little; every row still decodes to its greedy tokens."""
    lengths = sorted((p.length for p in prompt_pool), reverse=True)
    assert lengths[0] > 1.5 * lengths[-1]  # the pool mixes image sizes
    groups = prefill_groups(lengths)
    assert [i for group in groups for i in group] == list(range(len(lengths)))
    for group in groups:
        rows = [lengths[i] for i in group]
        assert len(rows) * max(rows) <= (1 + PREFILL_PADDING) * sum(rows)
    assert len(groups) > 1
    # one row alone, equal rows together
    assert prefill_groups([7]) == [range(0, 1)] and prefill_groups([5, 5, 5]) == [range(0, 3)]

    requests = make_requests(12, prompt_pool)
    engine = engine_for(model, eos, max_batch_size=64)
    for request, _ in requests:
        engine.add_request(request)
    admitted = engine.scheduler.admit()
    assert [s.request.prompt.length for s in admitted] == lengths
    assert [s.slot for s in admitted] == list(range(len(requests)))
    ties = [s for s in admitted if s.request.prompt.length == admitted[0].request.prompt.length]
    assert [s.request.request_id for s in ties] == sorted((s.request.request_id for s in ties), key=lambda r: int(r[1:]))

    for mode in ("spec", "ar"):
        engine = engine_for(model, eos, max_batch_size=64, block_size=8, mode=mode)
        for request, _ in requests:
            engine.add_request(request)
        results = {r.request_id: r for r in engine.step()}  # the prefill, then one round
        if mode == "ar":  # the prefill's passes, then the round's one AR pass
            assert engine.runner.batched_passes == len(groups) + 1
        while engine.has_work():
            results.update((r.request_id, r) for r in engine.step())
        for request, index in requests:
            assert results[request.request_id].token_ids == expected(greedy_outputs, index, request.max_new_tokens)


def reference_kv(model, prompt, tokens: list[int]) -> DynamicCache:
    """The KV single-sequence decoding holds after committing `tokens`: prompt + all but
    the last token (which is the next round's input, not yet cached)."""
    cache = DynamicCache(config=model.config.text_config)
    first_position = prefill(model, prompt, cache).next_position
    cached = tokens[:-1]
    if cached:
        ids = torch.tensor([cached])
        positions = torch.arange(first_position, first_position + len(cached)).view(1, 1, -1).expand(3, 1, -1)
        mask = causal_attention_mask(prompt.length, len(cached))[None, None]
        model.logits_from_embeds(model.embed(ids), positions, mask, cache)
    return cache


@pytest.mark.parametrize("mode", ["spec", "ar"])
def test_requests_join_between_steps_and_the_cache_holds_only_committed_tokens(
        model, eos, prompt_pool, greedy_outputs, mode):
    """Requests arrive while others run and leave in any order; after every step each
    running sequence's slot holds exactly the KV of prompt + committed - 1 tokens (no
    rejected draft or mask token counted, nothing lost when a sequence is moved to a
    freed slot), equal to what single-sequence decoding of those tokens holds."""
    engine = engine_for(model, eos, mode=mode, max_batch_size=4, block_size=8, adaptive_block=False)
    arrivals = make_requests(12, prompt_pool, first=1)
    index_of = {r.request_id: index for r, index in arrivals}
    request_of = {r.request_id: r for r, _ in arrivals}
    results, step, moves = {}, 0, 0
    while arrivals or engine.has_work():
        if arrivals and step % 2 == 0:  # two join now, the others later
            for request, _ in arrivals[:2]:
                engine.add_request(request)
            arrivals = arrivals[2:]
        slot_before = {s.request.request_id: s.slot for s in engine.scheduler.running}
        for result in engine.step():
            results[result.request_id] = result
        step += 1
        running = engine.scheduler.running
        assert [s.slot for s in running] == list(range(len(running)))
        moves += sum(slot_before.get(s.request.request_id, s.slot) != s.slot for s in running)
        for sequence in running:
            assert engine.runner.cache.lengths[sequence.slot] == sequence.prompt_len + len(sequence.tokens) - 1
            reference = reference_kv(model, sequence.request.prompt, sequence.tokens)
            for layer in range(model.config.text_config.num_hidden_layers):
                keys, values = engine.runner.cache.slot_kv(sequence.slot, layer)
                torch.testing.assert_close(keys, reference.layers[layer].keys[0], rtol=0, atol=1e-10)
                torch.testing.assert_close(values, reference.layers[layer].values[0], rtol=0, atol=1e-10)
    assert moves > 0  # a sequence was moved into a freed slot, and its KV went with it
    assert len(results) == 12
    for request_id, result in results.items():
        request = request_of[request_id]
        assert result.token_ids == expected(greedy_outputs, index_of[request_id], request.max_new_tokens)
        assert result.timings.queue_seconds >= 0 and result.timings.decode_seconds >= 0
        if mode != "ar":  # newcomers verified their prefill's drafts in rounds where others drafted
            reference = speculative_decode(model, request.prompt, request.max_new_tokens, eos, block_size=8)
            assert result.stats.accepted_per_round == reference.stats.accepted_per_round
            assert result.stats.forward_passes == reference.stats.forward_passes


def test_over_long_request_is_refused_clearly(model, eos, prompt_pool, greedy_outputs):
    engine = engine_for(model, eos, max_batch_size=2)
    prompt = prompt_pool[0]
    with pytest.raises(RequestTooLong, match="max_seq_len of 256"):
        engine.add_request(Request("too-long", prompt, 256 - prompt.length + 1))
    with pytest.raises(ValueError):
        engine.add_request(Request("zero", prompt, 0))
    assert not engine.has_work()
    [result] = engine.generate([Request("fits", prompt, 256 - prompt.length)])  # still usable
    assert result.token_ids == greedy_outputs[0]


def test_cache_that_does_not_fit_is_refused_before_allocating(model, eos):
    with pytest.raises(CacheTooLarge, match="lower max_batch_size or max_seq_len"):
        Engine(model, EngineConfig(max_batch_size=10**6, max_seq_len=4096, dtype=torch.float64, num_threads=1), eos)


def test_generate_refuses_a_busy_engine_and_duplicate_ids(model, eos, prompt_pool):
    engine = engine_for(model, eos, max_batch_size=2)
    engine.add_request(Request("a", prompt_pool[0], 4))
    with pytest.raises(ValueError, match="already queued"):
        engine.add_request(Request("a", prompt_pool[1], 4))
    with pytest.raises(RuntimeError):
        engine.generate([Request("b", prompt_pool[1], 4)])


@pytest.mark.parametrize("mode", ["spec", "ar"])
def test_aborted_requests_leave_and_the_others_stay_exact(model, eos, prompt_pool, greedy_outputs, mode):
    """Aborting a running sequence from a middle slot (the last slot's sequence and its KV
    move into it) and a waiting one: they never come back, every other request is still
    exactly greedy, and the slot cache still holds only committed tokens' KV."""
    engine = engine_for(model, eos, mode=mode, max_batch_size=3, block_size=8)
    requests = [(Request(f"a{i}", prompt_pool[i], 40), i) for i in range(6)]  # none ends in one round
    for request, _ in requests:
        engine.add_request(request)
    results = {r.request_id: r for r in engine.step()}
    running = engine.scheduler.running
    assert len(running) == 3 and len(engine.scheduler.waiting) == 3
    middle = running[1].request.request_id
    last_before = running[2]
    waiting = engine.scheduler.waiting[1].request.request_id
    assert engine.abort(middle) and engine.abort(waiting)
    assert not engine.abort(middle) and not engine.abort("never-added")
    assert [s.slot for s in engine.scheduler.running] == [0, 1]
    assert engine.scheduler.running[1] is last_before  # moved into the freed slot
    for sequence in engine.scheduler.running:
        assert engine.runner.cache.lengths[sequence.slot] == sequence.prompt_len + len(sequence.tokens) - 1
        reference = reference_kv(model, sequence.request.prompt, sequence.tokens)
        keys, _ = engine.runner.cache.slot_kv(sequence.slot, 0)
        torch.testing.assert_close(keys, reference.layers[0].keys[0], rtol=0, atol=1e-10)
    while engine.has_work():
        results.update((r.request_id, r) for r in engine.step())
    assert set(results) == {r.request_id for r, _ in requests} - {middle, waiting}
    for request, index in requests:
        if request.request_id in results:
            assert results[request.request_id].token_ids == expected(greedy_outputs, index, request.max_new_tokens)
    stats = engine.stats()
    assert (stats.aborted_requests, stats.finished_requests, stats.batch_size, stats.waiting) == (2, 4, 0, 0)
    [again] = engine.generate([Request(middle, prompt_pool[0], 5)])  # an aborted id may be used again
    assert again.token_ids == expected(greedy_outputs, 0, 5)


def test_loop_withdraws_cancelled_requests_waiting_or_running(model, eos, prompt_pool, greedy_outputs):
    """`future.cancel()` on an `EngineLoop` request drops it from the engine (running) or
    before admission (still queued); the others finish exactly greedy."""
    import threading

    from gravityocr.model.engine.loop import EngineLoop

    # The longest greedy output: a step commits at most block_size + 1 = 5 tokens, so a
    # request for all of it is still running after the first step.
    long_index = max(range(len(greedy_outputs)), key=lambda i: len(greedy_outputs[i]))
    assert len(greedy_outputs[long_index]) > 2 * 5
    first_step, gate = threading.Event(), threading.Event()

    def hold_after_first_step(stats, finished, lanes):
        first_step.set()
        gate.wait(60)

    loop = EngineLoop(lambda: engine_for(model, eos, max_batch_size=4, block_size=4), on_step=hold_after_first_step)
    try:
        running = loop.submit(Request("long", prompt_pool[long_index], REFERENCE_MAX_NEW))
        other = loop.submit(Request("other", prompt_pool[0], 20))
        assert first_step.wait(60)
        queued = loop.submit(Request("queued", prompt_pool[1], 20))  # the loop thread is held: not admitted
        assert running.cancel() and queued.cancel()
        gate.set()
        assert other.result(60).token_ids == expected(greedy_outputs, 0, 20)
        for _ in range(600):
            stats = loop.stats()
            if stats.aborted_requests == 2 and stats.batch_size == stats.waiting == 0:
                break
            threading.Event().wait(0.1)
        assert (stats.aborted_requests, stats.finished_requests, stats.batch_size, stats.waiting) == (2, 1, 0, 0)
        assert running.cancelled() and queued.cancelled()
        again = loop.submit(Request("after", prompt_pool[long_index], 9))  # the loop keeps serving
        assert again.result(60).token_ids == expected(greedy_outputs, long_index, 9)
    finally:
        gate.set()
        loop.stop()


def test_loop_streams_each_rounds_tokens_before_the_result(model, eos, prompt_pool, greedy_outputs):
    """`on_tokens` gets the committed tokens round by round (a speculative round commits
    several), all of them before the future resolves; joined, they are the greedy output."""
    from gravityocr.model.engine.loop import EngineLoop

    loop = EngineLoop(lambda: engine_for(model, eos, max_batch_size=4, block_size=8))
    try:
        chunks: dict[int, list[list[int]]] = {index: [] for index in range(4)}
        futures = {index: loop.submit(Request(f"s{index}", prompt_pool[index], REFERENCE_MAX_NEW),
                                      on_tokens=chunks[index].append) for index in range(4)}
        for index, future in futures.items():
            result = future.result(60)
            streamed = [token for chunk in chunks[index] for token in chunk]
            assert streamed == result.token_ids == expected(greedy_outputs, index, REFERENCE_MAX_NEW)
            assert all(chunks[index])
        assert any(len(chunk) > 1 for index in chunks for chunk in chunks[index][1:])  # rounds with accepted drafts
        assert max(len(c) for c in chunks.values()) > 2
    finally:
        loop.stop()


def test_an_on_step_that_raises_is_logged_and_the_loop_goes_on(model, eos, prompt_pool, greedy_outputs, caplog):
    """A metrics observer with a bug must not stop the engine: every request still finishes."""
    from gravityocr.model.engine.loop import EngineLoop

    def broken(stats, finished, lanes):
        raise TypeError("an observer's bug")

    loop = EngineLoop(lambda: engine_for(model, eos, max_batch_size=4, block_size=4), on_step=broken)
    try:
        requests = make_requests(3, prompt_pool)
        futures = loop.submit_all([Request(r.request_id, r.prompt, 16) for r, _ in requests])
        for (request, index), future in zip(requests, futures):
            assert future.result(60).token_ids == expected(greedy_outputs, index, 16)
    finally:
        loop.stop()
    assert "on_step failed" in caplog.text


def test_online_requests_go_first_and_preempt_batch_ones_all_exact(model, eos, prompt_pool, greedy_outputs):
    """Lanes: batch requests fill the slots; an online request submitted while they hold
    every slot and more wait is admitted at the next step, beside no more batch rows than
    online ones (the others preempted, back at the head of the backlog); every request,
    preempted ones included, writes its greedy output."""
    from gravityocr.model.engine.loop import BATCH, ONLINE, EngineLoop

    steps: list[tuple[set[str], dict]] = []  # per step: requests running after it, waiting per lane
    first_step, gate = threading.Event(), threading.Event()
    loop_box: list = []

    def record(stats, finished, lanes):
        engine = loop_box[0]._engine
        steps.append(({s.request.request_id for s in engine.scheduler.running}, dict(lanes.waiting)))
        first_step.set()
        gate.wait(60)

    loop = EngineLoop(lambda: engine_for(model, eos, max_batch_size=3, block_size=4), on_step=record)
    loop_box.append(loop)
    try:
        batch = make_requests(8, prompt_pool)
        batch_futures = loop.submit_all([Request(r.request_id, r.prompt, REFERENCE_MAX_NEW) for r, _ in batch],
                                        lane=BATCH)
        assert first_step.wait(60)
        assert len(steps[0][0]) == 3 and steps[0][1][BATCH] == 5  # three in slots, five in the backlog
        long_index = max(range(len(greedy_outputs)), key=lambda i: len(greedy_outputs[i]))
        online = loop.submit(Request("online", prompt_pool[long_index], REFERENCE_MAX_NEW))
        with pytest.raises(ValueError, match="lane"):
            loop.submit(Request("x", prompt_pool[0], 4), lane="nightly")
        gate.set()
        assert online.result(60).token_ids == expected(greedy_outputs, long_index, REFERENCE_MAX_NEW)
        assert "loop-8" in steps[1][0]  # the online request runs from the step after its submission
        assert len(steps[1][0]) == 2  # beside it, no more batch rows than online ones
        for (request, index), future in zip(batch, batch_futures):
            assert future.result(60).token_ids == expected(greedy_outputs, index, REFERENCE_MAX_NEW)
        lanes = loop.lanes()
        assert lanes.preempted >= 1 and lanes.admitted == {ONLINE: 1, BATCH: 8 + lanes.preempted}
        assert lanes.waiting == {ONLINE: 0, BATCH: 0} and loop.stats().preempted_requests == lanes.preempted
    finally:
        gate.set()
        loop.stop()


def test_the_loop_thread_runs_torch_on_the_engine_threads_and_the_caller_on_one(model, eos, prompt_pool,
                                                                               greedy_outputs):
    """The engine is built and stepped on the loop's thread with its config's torch threads;
    the thread that started the loop runs torch on one from then on (model/engine/threads.py:
    a second multi-threaded team in the process makes GNU OpenMP's workers sleep between ops)."""
    from gravityocr.model.engine.loop import EngineLoop

    caller_threads = torch.get_num_threads()
    seen: list[tuple[str, int]] = []

    def build() -> Engine:
        engine = engine_for(model, eos, max_batch_size=2, block_size=8, num_threads=2)
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return engine

    try:
        loop = EngineLoop(build, on_step=lambda stats, finished, lanes: seen.append(
            (threading.current_thread().name, torch.get_num_threads())))
        try:
            assert torch.get_num_threads() == 1
            result = loop.submit(Request("a", prompt_pool[0], REFERENCE_MAX_NEW)).result(60)
            assert result.token_ids == expected(greedy_outputs, 0, REFERENCE_MAX_NEW)
        finally:
            loop.stop()
        assert len(seen) >= 2 and set(seen) == {("engine-loop", 2)}
    finally:
        torch.set_num_threads(caller_threads)


def test_a_loop_whose_engine_cannot_be_built_raises_on_the_caller():
    from gravityocr.model.engine.loop import EngineLoop

    def build() -> Engine:
        raise ValueError("max_seq_len 9999 exceeds the model's context")

    with pytest.raises(ValueError, match="exceeds the model's context"):
        EngineLoop(build)


def test_engine_threads_are_reserved_and_work_off_the_caller_runs_on_them(monkeypatch):
    from gravityocr.model.engine import threads

    caller_threads = torch.get_num_threads()
    monkeypatch.setattr(threads, "_reserved", None)
    try:
        with pytest.raises(ValueError, match="at least 1"):
            threads.reserve_for_engine(0)
        assert threads.reserve_for_engine(2) == 2 and threads.engine_threads() == 2
        assert torch.get_num_threads() == 1
        assert threads.reserve_for_engine() == 2  # a later call keeps the count
        worker, count = threads.on_engine_thread(lambda: (threading.current_thread().name, torch.get_num_threads()))
        assert worker.startswith("engine") and count == 2 and torch.get_num_threads() == 1
        with pytest.raises(KeyError):  # the function's error reaches the caller
            threads.on_engine_thread(lambda: {}["missing"])
    finally:
        torch.set_num_threads(caller_threads)


def test_bench_decode_prints_rows_and_peers(model, processor, tmp_path, capsys):
    """`gravityocr bench decode` runs end to end on saved weights (figures are not judged)."""
    import json

    from gravityocr.bench.decode import main
    from gravityocr.model.network.loading import Recognizer, save_recognizer

    save_recognizer(Recognizer(model, processor), tmp_path / "model")
    argv = ["--model", str(tmp_path / "model"), "--dtype", "float64", "--batch-sizes", "1,3", "--limit", "3",
            "--max-new-tokens", "12", "--repeats", "1", "--threads", "1", "--speculative-max-batch", "2", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["settings"]["speculative_max_batch"] == 2 and report["settings"]["structured_drafts"] is True
    assert {(row["batch_size"], row["type"]) for row in report["rows"]} == {
        (b, t) for b in (1, 3) for t in ("all", "text", "table", "formula")}
    for row in report["rows"]:
        assert row["exact"] is True  # speculative at every batch size, and capped (AR rounds at batch 3)
        assert row["tpf"] >= 1.0 and row["ar_tok_s"] > 0 and row["spec_tok_s"] > 0
        assert row["capped_tpf"] >= 1.0 and row["capped_tok_s"] > 0
    assert report["peers"]["hf_generate_greedy"]["same_as_engine_ar"] is True


def test_drafts_accepted_past_an_eos_are_not_counted(trained_tiny_model, overfit_samples):
    """eos a token in the middle of a memorised target: the round that reaches it also has
    right drafts after it, which the AR model agrees with; the engine counts only the
    accepted drafts it commits, as the reference decoder does."""
    model = trained_tiny_model
    for sample in overfit_samples:
        target = sample.target_ids
        eos_token = next(t for t in target[12:] if target.index(t) >= 12)  # first written past the 12th token
        engine = engine_for(model, [eos_token], max_batch_size=2, block_size=16)
        [result] = engine.generate([Request("a", sample.prompt, 120)])
        reference = speculative_decode(model, sample.prompt, 120, {eos_token}, block_size=16)
        assert result.token_ids == reference.token_ids == target[:target.index(eos_token) + 1]
        assert result.stats.accepted_per_round == reference.stats.accepted_per_round
