"""What the backends produce, tested without their GPU stacks.

Unsloth and vLLM need CUDA, which CI lacks, so `MockFastLanguageModel` below
stands in for Unsloth's FastLanguageModel: it records the calls the loader makes, which is what is tested.
"""

import os
import sys
import types

import pytest

from grpo_equivalence.training import backends
from grpo_equivalence.training.backends import BackendUnavailable, LoadSpec
from grpo_equivalence.training.backends.base import lora_config
from helpers import ALL_SEVEN, assert_shared_inputs_exact, shared_inputs_step, small_qwen3_config

LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


def spec(**options):
    return LoadSpec(model="some/model", dtype="bfloat16", lora=LORA, max_seq_length=512, device="cuda", seed=3407,
                    gradient_checkpointing=False, options=options)


def stand_in_vllm(monkeypatch, llm, **more) -> None:
    """vLLM is not installed here: `llm` stands in for vllm.entrypoints.llm.LLM (with `more` modules by name) for the
    test."""
    for name, module in {"vllm": types.ModuleType("vllm"), "vllm.entrypoints": types.ModuleType("vllm.entrypoints"),
                         "vllm.entrypoints.llm": types.SimpleNamespace(LLM=llm), **more}.items():
        monkeypatch.setitem(sys.modules, name, module)

def test_every_study_backend_is_registered_by_its_file():
    assert backends.names() == ["cb_paged", "hf", "hf_static", "native", "trl_vllm", "unsloth_fi_false", "vllm"]
    for name in backends.names():
        assert backends.get(name).name == name
        assert backends.module_file(name).endswith(f"backends/{name}.py")


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(KeyError, match="unknown backend 'sglang'; choose among cb_paged, hf"):
        backends.get("sglang")


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("hf", {}),
        ("cb_paged", {"use_transformers_continuous_batching": True, "transformers_continuous_batching_config": None}),
        ("unsloth_fi_false", {"use_vllm": False}),
        ("vllm", {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.5}),  # Unsloth's default
        ("trl_vllm", {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3}),  # TRL's default
    ],
)
def test_backends_change_only_the_rollout_settings(name, overrides):
    assert backends.get(name).grpo_overrides({}) == overrides


def test_backend_options_reach_the_trainer():
    for name in ("vllm", "trl_vllm"):
        assert backends.get(name).grpo_overrides({"gpu_memory_utilization": 0.6})["vllm_gpu_memory_utilization"] == 0.6
    assert set(backends.get("vllm").options) == {"gpu_memory_utilization"}
    assert set(backends.get("trl_vllm").options) == {"gpu_memory_utilization", "exact_top_p"}
    assert backends.get("trl_vllm").flags == ("exact_top_p",)
    cb = backends.get("cb_paged").grpo_overrides({"continuous_batching": {"num_blocks": 16}})
    assert cb["transformers_continuous_batching_config"] == {"num_blocks": 16}


def test_exact_top_p_makes_vllms_sampler_filter_by_sorting_at_every_batch_size(monkeypatch):
    """exact_top_p replaces the top-k/top-p function vLLM's PyTorch sampler looks up at each step by vLLM's own
    sort-based one, whatever the batch, also in a module that imported it by name before (vLLM 0.26's model runner
    V2, built with the engine before the trainer is prepared); without it vLLM is left as it is. (vLLM cannot be
    imported here: stand-in modules in its place, whose dispatcher takes the Triton kernel from 8 rows on as vLLM
    0.26's does.)"""
    from grpo_equivalence.training import vllm_kernel

    calls = []
    stand_in = types.ModuleType(vllm_kernel.SAMPLER_MODULE)
    stand_in.apply_top_k_top_p = lambda logits, k, p: calls.append("triton" if len(logits) >= 8 else "sort")
    stand_in.apply_top_k_top_p_pytorch = lambda logits, k, p: calls.append("sort")
    monkeypatch.setitem(sys.modules, vllm_kernel.SAMPLER_MODULE, stand_in)
    runner_v2 = types.ModuleType("vllm.v1.worker.gpu.sample.sampler")  # `from ... import apply_top_k_top_p`
    runner_v2.apply_top_k_top_p = stand_in.apply_top_k_top_p
    monkeypatch.setitem(sys.modules, runner_v2.__name__, runner_v2)
    trl_vllm = backends.get("trl_vllm")
    spec = types.SimpleNamespace(options={"exact_top_p": False})
    assert trl_vllm.prepare_trainer(None, spec) == []
    stand_in.apply_top_k_top_p([0] * 8, None, None)
    assert calls == ["triton"]
    spec.options["exact_top_p"] = True
    assert trl_vllm.prepare_trainer(None, spec) == ["vllm.exact_top_p"]
    sys.modules[vllm_kernel.SAMPLER_MODULE].apply_top_k_top_p([0] * 8, None, None)
    sys.modules[vllm_kernel.SAMPLER_MODULE].apply_top_k_top_p([0] * 2, None, None)
    runner_v2.apply_top_k_top_p([0] * 8, None, None)  # the engine's own sampler: sort-based too
    assert calls == ["triton", "sort", "sort", "sort"]
    del stand_in.apply_top_k_top_p_pytorch  # a vLLM without it: refused by name, not silently left as it is
    with pytest.raises(RuntimeError, match="no apply_top_k_top_p_pytorch"):
        trl_vllm.prepare_trainer(None, spec)


class MockFastLanguageModel:
    """Stands in for unsloth.FastLanguageModel: records the loader's calls."""

    calls = []

    @classmethod
    def from_pretrained(cls, **kwargs):
        cls.calls.append(("from_pretrained", kwargs))
        return "model", "tokenizer"

    @classmethod
    def get_peft_model(cls, model, **kwargs):
        cls.calls.append(("get_peft_model", kwargs))
        return "peft-model"


@pytest.fixture
def mock_unsloth(monkeypatch):
    MockFastLanguageModel.calls = []
    monkeypatch.setitem(sys.modules, "unsloth", types.SimpleNamespace(FastLanguageModel=MockFastLanguageModel))
    return MockFastLanguageModel.calls


@pytest.mark.parametrize("name, fast_inference", [("unsloth_fi_false", False), ("vllm", True)])
def test_unsloth_loaders_use_the_same_lora_as_the_vanilla_backends(mock_unsloth, name, fast_inference):
    loaded = backends.get(name).load(spec(gpu_memory_utilization=0.6) if fast_inference else spec())
    (_, load_kwargs), (_, peft_kwargs) = mock_unsloth
    assert load_kwargs["model_name"] == "some/model" and load_kwargs["fast_inference"] is fast_inference
    assert load_kwargs["load_in_4bit"] is False and load_kwargs["max_lora_rank"] == 8
    assert ("gpu_memory_utilization" in load_kwargs) is fast_inference
    if fast_inference:
        assert load_kwargs["gpu_memory_utilization"] == 0.6
    vanilla = lora_config(LORA)
    assert peft_kwargs["r"] == vanilla.r and peft_kwargs["lora_alpha"] == vanilla.lora_alpha
    assert peft_kwargs["lora_dropout"] == vanilla.lora_dropout
    assert set(peft_kwargs["target_modules"]) == set(vanilla.target_modules)
    assert peft_kwargs["use_gradient_checkpointing"] is False and peft_kwargs["random_state"] == 3407
    # Unsloth wraps the model itself, so TRL must not wrap it a second time.
    assert loaded.model == "peft-model" and loaded.peft_config is None


def test_unsloth_sizes_the_vllm_engine_from_the_devices_total_memory_not_what_its_neighbours_left(mock_unsloth,
                                                                                                   monkeypatch):
    """Unsloth derives the engine's share and batch limits from unsloth_zoo.vllm_utils.get_mem_info (free, total):
    while the vllm backend loads it reads the total as free, and the measurement is back afterwards. Stand-in for
    unsloth_zoo.vllm_utils (Unsloth needs CUDA)."""
    zoo = types.SimpleNamespace(get_mem_info=lambda: (30, 140))  # 30 of 140 left free by the jobs beside this one
    monkeypatch.setitem(sys.modules, "unsloth_zoo", types.SimpleNamespace(vllm_utils=zoo))
    monkeypatch.setitem(sys.modules, "unsloth_zoo.vllm_utils", zoo)
    seen = []
    original = MockFastLanguageModel.from_pretrained.__func__

    def from_pretrained(cls, **kwargs):
        seen.append(zoo.get_mem_info())
        return original(cls, **kwargs)

    monkeypatch.setattr(MockFastLanguageModel, "from_pretrained", classmethod(from_pretrained))
    backends.get("vllm").load(spec(gpu_memory_utilization=0.1))
    assert seen == [(140, 140)] and zoo.get_mem_info() == (30, 140)
    backends.get("unsloth_fi_false").load(spec())  # no engine: Unsloth reads the device as it is
    assert seen == [(140, 140), (30, 140)]


def test_vllm_absent_is_named_with_the_fix(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real("json"))
    with pytest.raises(BackendUnavailable) as error:
        backends.get("vllm").check_runnable("cuda")
    message = str(error.value)
    assert "backend 'vllm' cannot run here: missing package(s) vllm" in message
    assert "pip install vllm" in message and "drop 'vllm' from `backends`" in message
    assert "CUDA" not in message


def test_vllm_backends_run_the_engine_in_process_and_report_nothing(monkeypatch, tmp_path):
    """And their engines start holding the GPU's quiet lock (no neighbour's memory changes during vLLM's memory
    profiling). Stand-ins: Unsloth's import patches, and vLLM's LLM class (vLLM is not installed here)."""
    import fcntl
    import os

    from grpo_equivalence.runtime import quietlock

    held = []

    class LLM:
        def __init__(self, model):
            with open(tmp_path / "gpu-0.quiet") as f:  # another open file: its lock must be taken already
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held.append(False)
                except BlockingIOError:
                    held.append(True)

    stand_in_vllm(monkeypatch, LLM)
    (tmp_path / "gpu-0.quiet").touch()
    monkeypatch.setenv(quietlock.QUIET_ENV, str(tmp_path / "gpu-0.quiet"))
    for name in ("vllm", "trl_vllm"):
        for var in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "MASTER_PORT", "MASTER_ADDR"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setitem(sys.modules, "unsloth", types.SimpleNamespace())
        backends.get(name).before_trl_import()
        assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        assert os.environ["VLLM_NO_USAGE_STATS"] == "1" and os.environ["DO_NOT_TRACK"] == "1"
        LLM(model="m")
        port = int(os.environ["MASTER_PORT"])  # a free one of its own, not the engine's fixed default
        assert 1024 < port and os.environ["MASTER_ADDR"] == "127.0.0.1"
    assert held == [True, True]


def test_a_vllm_engine_start_that_saw_a_neighbour_free_memory_is_tried_again(monkeypatch):
    """vLLM stops when the device's free memory rose while it profiled (a job beside it freed some). Stand-in for
    vLLM's LLM: fails so once, then starts."""
    from grpo_equivalence.training.backends import _vllm

    attempts = []

    class LLM:
        def __init__(self):
            attempts.append(1)
            if len(attempts) == 1:
                raise AssertionError("Error in memory profiling. Initial free memory 116.1 GiB, current free memory "
                                     "116.7 GiB. This happens when other processes sharing the same container release")

    stand_in_vllm(monkeypatch, LLM)
    monkeypatch.delenv("GRPO_EQUIVALENCE_GPU_QUIET", raising=False)
    _vllm.start_engines_quietly()
    LLM()
    assert len(attempts) == 2


def test_in_a_packed_study_a_vllm_engine_is_told_its_kv_cache_and_measures_nothing(monkeypatch, tmp_path):
    """Where the jobs of a study share GPUs, an engine whose arguments bound its sequences gets the KV cache they can
    ever fill (vLLM's kv_cache_memory_bytes: no memory profiling) and starts holding the GPU's quiet lock shared;
    outside such a study, or where vLLM is left to pick the number of sequences, it measures as before. Stand-in for
    vLLM's LLM (vLLM is not installed here)."""
    import fcntl

    from transformers import Qwen3Config

    from grpo_equivalence.runtime import quietlock
    from grpo_equivalence.training.backends import _vllm

    quiet = tmp_path / "gpu-0.quiet"
    quiet.touch()
    started = []

    class LLM:
        def __init__(self, **kwargs):
            with open(quiet) as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    mode = "shared"
                except BlockingIOError:
                    mode = "exclusive"
            started.append((kwargs.get("kv_cache_memory_bytes"), mode))

    stand_in_vllm(monkeypatch, LLM)
    monkeypatch.setattr(_vllm, "_startup_plans", lambda: None)  # a vLLM without startup plans: it would measure
    Qwen3Config(num_hidden_layers=2, num_key_value_heads=2, num_attention_heads=4, head_dim=8, hidden_size=32,
                max_position_embeddings=512).save_pretrained(tmp_path / "model")
    monkeypatch.setenv(quietlock.QUIET_ENV, str(quiet))
    _vllm.start_engines_quietly()
    engine = dict(model=str(tmp_path / "model"), max_num_seqs=64, max_model_len=250, dtype="bfloat16")
    LLM(**engine)  # not a packed study
    monkeypatch.setenv(quietlock.SIZED_ENV, "1")
    LLM(**engine)
    LLM(**{**engine, "max_model_len": None})  # the model's context, 512 tokens
    LLM(**{**engine, "max_num_seqs": None})  # vLLM picks how many: nothing bounds the cache
    # 64 sequences of 16 blocks of 16 tokens, 2 layers x (K and V) x 2 heads x 8 dims x 2 bytes a token
    assert started == [(None, "exclusive"), (64 * 256 * 128, "shared"), (64 * 512 * 128, "shared"), (None, "exclusive")]


@pytest.fixture
def vllm_standins(monkeypatch, tmp_path):
    """Stand-ins for vLLM's LLM, its worker and its plan module, each doing what vLLM 0.26 does at those points
    (vLLM is not installed here), with start_engines_quietly applied and a lease's quiet lock: what each engine
    start saw (seen: the lock at its memory snapshot, the lock at profiling, whether it profiled) and the free
    memory of each start (starts); fingerprint sets the settings' fingerprint at the snapshot and at profiling."""
    import fcntl
    import json

    from grpo_equivalence.runtime import quietlock
    from grpo_equivalence.training.backends import _vllm

    cache = tmp_path / "vllm"
    quiet = tmp_path / "gpu-0.quiet"
    quiet.touch()
    seen, starts = [], []
    fingerprint = {"init": "settings-a", "apply": "settings-a"}

    def lock_mode():
        with open(quiet) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return "shared"
            except BlockingIOError:
                return "exclusive"

    def plan_path(name):
        return cache / "startup_plan" / f"startup_plan_{name}.json"

    def load_plan(name):
        return json.loads(plan_path(name).read_text()) if plan_path(name).exists() else None

    def applicable(plan, free):  # vLLM's gate: no less free memory than when the plan was recorded
        return plan["kv_cache_memory_bytes"] if free >= plan["free_memory_baseline"] else None

    def maybe_apply(worker):
        plan = load_plan(fingerprint["apply"])
        if plan is not None:
            kv = startup_plan._applicable_kv_cache_memory_bytes(plan, worker.free)
            if kv is not None:
                worker.cache_config.kv_cache_memory_bytes = kv

    class Worker:
        def __init__(self, free):
            self.free, self.rank, self.vllm_config = free, 0, "config"
            self.parallel_config = types.SimpleNamespace(world_size=1)
            self.cache_config = types.SimpleNamespace(kv_cache_memory_bytes=None)

        def init_device(self):
            self.snapshot_lock = lock_mode()  # vLLM's memory snapshot

    startup_plan = types.SimpleNamespace(compute_plan_fingerprint=lambda *a: fingerprint["init"], _load_plan=load_plan,
                                         _applicable_kv_cache_memory_bytes=applicable,
                                         maybe_apply_startup_plan=maybe_apply)
    gpu_worker = types.SimpleNamespace(maybe_apply_startup_plan=maybe_apply, Worker=Worker)

    class LLM:
        def __init__(self, free=100):
            starts.append(free)
            worker = gpu_worker.Worker(free)
            worker.init_device()
            gpu_worker.maybe_apply_startup_plan(worker)  # vLLM's determine_available_memory, before profiling
            profiled = worker.cache_config.kv_cache_memory_bytes is None
            seen.append((worker.snapshot_lock, lock_mode(), profiled))
            if profiled:
                plan_path(fingerprint["apply"]).parent.mkdir(parents=True, exist_ok=True)
                plan_path(fingerprint["apply"]).write_text(json.dumps({"kv_cache_memory_bytes": 7,
                                                                       "free_memory_baseline": free}))

    stand_in_vllm(monkeypatch, LLM, **{
        "vllm.envs": types.SimpleNamespace(VLLM_CACHE_ROOT=str(cache)), "vllm.v1": types.ModuleType("vllm.v1"),
        "vllm.v1.worker": types.SimpleNamespace(gpu_worker=gpu_worker, startup_plan=startup_plan),
        "vllm.v1.worker.gpu_worker": gpu_worker, "vllm.v1.worker.startup_plan": startup_plan})
    monkeypatch.setitem(sys.modules["vllm"].__dict__, "envs", sys.modules["vllm.envs"])
    monkeypatch.setattr(_vllm.time, "sleep", lambda s: None)
    monkeypatch.setenv(quietlock.QUIET_ENV, str(quiet))
    _vllm.start_engines_quietly()
    return types.SimpleNamespace(LLM=LLM, seen=seen, starts=starts, fingerprint=fingerprint, cache=cache,
                                 startup_plan=startup_plan, plan_path=plan_path, lock_mode=lock_mode)


def test_only_a_settings_first_vllm_engine_profiles_alone_the_later_ones_apply_its_plan_beside_others(monkeypatch,
                                                                                                   vllm_standins):
    """The first engine of a compile-cache folder profiles holding the quiet lock exclusively and records vLLM's
    startup plan; later ones apply the plan whatever the free memory (the lease holds their share) and hold the
    lock shared; one whose settings have no plan takes the lock exclusively before its memory snapshot; one that
    found out only later starts again exclusively."""
    from grpo_equivalence.runtime import quietlock

    v = vllm_standins
    LLM, seen, starts, fingerprint, startup_plan = v.LLM, v.seen, v.starts, v.fingerprint, v.startup_plan
    LLM(free=100)  # the first: profiles, alone
    LLM(free=40)  # less free memory than the plan's baseline, which vLLM's own gate would refuse: applies it
    fingerprint.update(init="settings-b", apply="settings-b")  # a plan is there, for other settings
    LLM(free=100)
    fingerprint.update(init="settings-a", apply="settings-c")  # the settings changed after the snapshot
    LLM(free=100)
    assert seen == [("exclusive", "exclusive", True), ("shared", "shared", False), ("exclusive", "exclusive", True),
                    ("exclusive", "exclusive", True)]
    assert starts == [100, 40, 100, 100, 100]  # only the last started twice
    monkeypatch.delenv(quietlock.QUIET_ENV)  # no lease: vLLM's gate as it is
    assert startup_plan._applicable_kv_cache_memory_bytes({"kv_cache_memory_bytes": 7, "free_memory_baseline": 100},
                                                          40) is None


def test_a_vllm_engine_waits_for_the_one_measuring_its_settings_and_then_applies_its_plan(vllm_standins, capsys):
    """While another engine of the compile-cache folder measures (it holds the folder's measuring lock and no plan is
    recorded), a starting engine waits there, holding no lock of the GPU, and then applies the recorded plan with
    the GPU's lock shared instead of measuring in its turn. One whose measuring engine died (no plan recorded when
    the lock comes free) measures itself."""
    import fcntl
    import json
    import threading

    from grpo_equivalence.training.backends import _vllm

    v = vllm_standins
    folder = v.cache / "startup_plan"
    folder.mkdir(parents=True)
    measuring = open(folder / _vllm.MEASURING, "a")
    fcntl.flock(measuring, fcntl.LOCK_EX)  # another process's engine, measuring
    gpu_locks = []

    def finish_measuring():
        gpu_locks.append(v.lock_mode())  # the waiting engine holds no lock of the GPU meanwhile
        v.plan_path("settings-a").write_text(json.dumps({"kv_cache_memory_bytes": 7, "free_memory_baseline": 100}))
        measuring.close()

    timer = threading.Timer(0.5, finish_measuring)
    timer.start()
    v.LLM(free=100)
    timer.join()
    assert gpu_locks == ["shared"]  # free: neither taken nor waited for
    assert v.seen == [("shared", "shared", False)] and v.starts == [100]
    assert "for the first vLLM engine of these settings to measure the GPU's memory" in capsys.readouterr().out
    v.fingerprint.update(init="settings-d", apply="settings-d")
    v.plan_path("settings-a").unlink()
    dead = open(folder / _vllm.MEASURING, "a")
    fcntl.flock(dead, fcntl.LOCK_EX)
    threading.Timer(0.2, dead.close).start()  # died before it recorded a plan
    v.LLM(free=100)
    assert v.seen[-1] == ("exclusive", "exclusive", True)


def test_trl_vllm_loads_with_transformers_and_peft(monkeypatch):
    """TRL's vLLM backend loads the model as the hf backend does; TRL applies the same LoRA."""
    import transformers

    calls = []
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda m, **kw: calls.append((m, kw)) or "model")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda m, **kw: "tokenizer")
    loaded = backends.get("trl_vllm").load(spec())
    assert calls[0][0] == "some/model" and str(calls[0][1]["dtype"]) == "torch.bfloat16"
    assert loaded.peft_config.r == lora_config(LORA).r and loaded.model == "model"


def test_unsloth_and_vllm_backends_need_cuda():
    for name in ("unsloth_fi_false", "vllm", "trl_vllm"):
        with pytest.raises(BackendUnavailable, match="needs a CUDA GPU"):
            backends.get(name).check_runnable("cpu")


def test_a_trainer_check_in_a_precision_the_engine_refuses_builds_the_stack_without_it():
    """Unsloth's vLLM load stops on float32 ("We do not support dtype = torch.float32 yet!"): a `vllm` reference's
    control (bfloat16 studies: float32) is its trainer stack without the engine, the fault kept; others as named."""
    assert backends.trainer_check_backend("vllm", "float32") == "unsloth_fi_false"
    assert backends.trainer_check_backend("vllm+no_kl", "float32") == "unsloth_fi_false+no_kl"
    assert backends.trainer_check_backend("vllm", "bfloat16") == "vllm"
    assert all(backends.trainer_check_backend(name, dtype) == name for name in ("hf", "trl_vllm", "native")
               for dtype in ("float32", "bfloat16"))
    for name in backends.names():  # every engine that refuses a precision names an existing backend of its stack
        backend = backends.get(name)
        if backend.engine_refuses:
            assert backends.get(backend.without_engine).stack == backend.stack


def test_a_train_job_checks_its_trackers_before_taking_a_gpu(tiny_config):
    """On a cluster the planning machine does not check: each train job does, before its GPU lease."""
    from grpo_equivalence.training import session, trackers

    tiny_config["grpo"]["report_to"] = ["tensorboard", "wandb"]
    assert trackers.named(tiny_config) == ["tensorboard", "wandb"]
    with pytest.raises(SystemExit, match="grpo.report_to names wandb, whose package"):
        session.check_packages("hf", tiny_config)
    tiny_config["grpo"]["report_to"] = "tensorboard"  # tensorboardX is installed: it will do
    session.check_packages("hf", tiny_config)
    tiny_config["grpo"]["report_to"] = "all"  # transformers takes whatever is installed
    assert trackers.problems(tiny_config) == []


def test_liger_kernels_are_refused_on_the_cpu_and_without_their_package_before_a_gpu_is_taken(tiny_config):
    """grpo.use_liger_kernel passes to TRL, which fails only once the trainer is built; Liger's kernels are Triton
    kernels for CUDA GPUs, and this machine has no liger-kernel."""
    from grpo_equivalence.training import session

    tiny_config["grpo"]["use_liger_kernel"] = True
    with pytest.raises(SystemExit, match=r"grpo.use_liger_kernel: .*this study trains on the CPU"):
        session.check_packages("hf", tiny_config)
    with pytest.raises(session.backends.BackendUnavailable, match="trains on the CPU"):
        session.check_runnable(tiny_config, ["hf"])
    tiny_config["gpus_per_train_job"] = 1
    with pytest.raises(SystemExit, match="grpo.use_liger_kernel needs liger-kernel .*pip install liger-kernel"):
        session.check_packages("hf", tiny_config)
    tiny_config["grpo"]["use_liger_kernel"] = False
    session.check_packages("hf", tiny_config)


def test_a_configuration_is_its_backend_with_its_grpo_settings_and_no_fault(tiny_config):
    """`native+liger` loads, samples and trains as `native` does, with the configuration's GRPOConfig settings over
    the study's; it is no fault (its runs record none), and a study may take it as its reference. On the CPU its
    kernels are refused before any job, naming the backend to drop."""
    from grpo_equivalence.study.validate import check
    from grpo_equivalence.training import faults, session

    assert backends.get("native+liger") is backends.get("native")
    assert faults.fault_of("native+liger") is None and faults.configuration_of("native+liger") == "liger"
    assert faults.fault_of("hf+no_min_p") == "no_min_p" and faults.configuration_of("hf+no_min_p") is None
    grpo = {"beta": 0.001, "use_liger_kernel": False}
    assert faults.grpo_settings("native+liger", grpo) == {"beta": 0.001, "use_liger_kernel": True}
    assert faults.grpo_settings("native", grpo) is grpo
    tiny_config.update(backends=["native", "native+liger"], reference="native+liger")
    check(tiny_config)  # no "faulted reference", no unknown fault
    tiny_config.update(backends=["native", "native+ligre"], reference="native")
    with pytest.raises(Exception, match="unknown fault 'ligre'.*configuration among liger"):
        check(tiny_config)
    with pytest.raises(BackendUnavailable, match=r"backends: native\+liger \(configuration 'liger': "
                                                  r"grpo.use_liger_kernel\): .*trains on the CPU .*drop native\+liger"):
        session.check_runnable(tiny_config, ["native", "native+liger"])
    session.check_runnable(tiny_config, ["native"])
    tiny_config.update(backends=["vllm", "vllm+lean"], reference="vllm")
    with pytest.raises(Exception, match="'vllm\\+lean': a configuration applies to the TRL \\+ PEFT backends"):
        check(tiny_config)
    tiny_config.update(backends=["hf", "hf+unmerged"], reference="hf")  # a backend option native alone has
    with pytest.raises(Exception, match="'hf\\+unmerged': configuration 'unmerged' sets unmerged_adapters, an option "
                                        "of native only; drop it, or use native\\+unmerged"):
        check(tiny_config)


def test_the_unmerged_configuration_sets_its_backend_option_for_that_backend_alone(tiny_config, primed):
    """`native+unmerged` is `native` with backend_options' unmerged_adapters on (over the study's), which its run
    records among its rollout settings; `native` in the same study keeps the study's options."""
    from grpo_equivalence.training.session import session

    common = {"model_path": primed["model"], "dataset": primed["dataset"], "log": lambda message: None}
    for name, unmerged in (("native+unmerged", True), ("native", False)):
        with session(tiny_config, name, 1, **common) as built:
            assert built.trainer.native_decoder.unmerged is unmerged
            assert ("generation.native_decoder.unmerged_adapters" in built.rollout_settings) is unmerged


def test_shared_adapter_inputs_compute_the_same_step_and_keep_less_for_the_backward_pass():
    """Under bfloat16 autocast, as the trainer runs on a GPU, the adapters that read the model's input as it is give
    the same logits and gradients bit for bit as PEFT's float32 copies, and autograd keeps fewer bytes; without
    autocast (the CPU's trainer) PEFT casts as before. CPU autocast casts by the GPU's rules (test_cuda.py: on CUDA)."""
    import torch
    from peft import get_peft_model
    from transformers import Qwen3ForCausalLM

    from grpo_equivalence.training.backends.base import share_adapter_inputs

    assert_shared_inputs_exact("cpu")
    eager, _, _ = shared_inputs_step("cpu", True, autocast=False)  # PEFT casts: float32 adapters on bfloat16 input
    assert eager.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="lora_dropout: 0.0"):
        share_adapter_inputs(get_peft_model(Qwen3ForCausalLM(small_qwen3_config()),
                                            lora_config({**ALL_SEVEN, "lora_dropout": 0.1})))


def test_a_configurations_settings_reach_the_trainer_over_the_studys(tiny_config, primed, monkeypatch):
    """The session builds BACKEND+CONFIGURATION's trainer with the configuration's settings, the study's for the rest
    (a configuration of the CPU's stands in for Liger's kernels, which need a CUDA GPU). Liger's kernels are on the
    model before the session is handed out, as train() puts them at its start: the checks never call train(). A
    stand-in records the call that applies them (test_cuda.py applies the real ones)."""
    import transformers.integrations.liger as liger

    from grpo_equivalence.training import faults
    from grpo_equivalence.training.session import session

    applied = []
    monkeypatch.setattr(liger, "apply_liger_kernel", lambda model, config: applied.append((model, config)))
    monkeypatch.setitem(faults.CONFIGURATIONS, "half_beta", {"what": "half the KL weight",
                                                             "grpo": {"beta": 0.0005, "use_liger_kernel": True},
                                                             "shared_inputs": True})
    common = {"model_path": primed["model"], "dataset": primed["dataset"], "log": lambda message: None}
    with session(tiny_config, "hf+half_beta", 1, **common) as built:
        assert built.trainer.args.beta == 0.0005 and built.backend == "hf+half_beta"
        assert [model for model, _ in applied] == [built.trainer.model]
        assert applied[0][1] == built.trainer.args.liger_kernel_config
        layers = [m for m in built.trainer.model.modules() if hasattr(m, "lora_A")]
        assert layers and all("_cast_input_dtype" in vars(m) for m in layers)  # shared inputs, on the CPU a no-op
        assert built.trainer.args.learning_rate == tiny_config["grpo"]["learning_rate"]
    assert tiny_config["grpo"]["beta"] != 0.0005


@pytest.mark.parametrize("sized", [False, True], ids=["measuring", "told-its-kv-cache"])
def test_a_vllm_engine_start_that_lost_its_port_to_another_is_tried_again(monkeypatch, tmp_path, sized):
    """Engines starting together race for the port of their one-process group (torch.distributed's EADDRINUSE: one
    of sixteen on an H200); the start is tried again on another, whether it measures the device or is told its KV
    cache (a packed study). Stand-in for vLLM's LLM: fails so once, then starts."""
    from grpo_equivalence.runtime import quietlock
    from grpo_equivalence.training.backends import _vllm

    attempts = []

    class LLM:
        def __init__(self, **kwargs):
            attempts.append(kwargs)
            if len(attempts) == 1:
                raise RuntimeError("The server socket has failed to listen on any local network address. port: 44215, "
                                   "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")

    stand_in_vllm(monkeypatch, LLM)
    monkeypatch.delenv("GRPO_EQUIVALENCE_GPU_QUIET", raising=False)
    monkeypatch.setenv("MASTER_PORT", "1")
    monkeypatch.setattr(_vllm.time, "sleep", lambda seconds: None)
    if sized:
        monkeypatch.setenv(quietlock.SIZED_ENV, "1")
        monkeypatch.setattr(_vllm, "kv_cache_bytes", lambda engine: 1 << 20)
    _vllm.start_engines_quietly()
    LLM()
    assert len(attempts) == 2 and os.environ["MASTER_PORT"] != "1"
    assert all(("kv_cache_memory_bytes" in a) == sized for a in attempts)
