"""The patch table (stagedyolo.engine.patches): reproducible mode trains bit-identically to yolov5's own train.py,
fast mode's rows do what they say, and docs/engine.md lists exactly the table."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from stage_specs import small_stage_plan, small_stage_spec

from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset
from stagedyolo.engine import patches
from stagedyolo.engine.offline import engine_environment
from stagedyolo.engine.patches import PATCHES, EngineContext, skip_reason
from stagedyolo.jsonio import write_json

ROOT = Path(__file__).resolve().parents[1]
SPEC = small_stage_spec(
    epochs=2, batch=4, lr0=0.01, optimizer="SGD", nosave=True, nominal_batch=64, min_warmup_iters=100
)


def ctx_for(mode="fast", device="cpu", **kw):
    plan = {"optimizer": "SGD", "nominal_batch": 64, "min_warmup_iters": 100, **kw.pop("plan", {})}
    return EngineContext(plan, device, False, None, mode=mode, **kw)


def applied(ctx):
    return [p.name for p in PATCHES if skip_reason(p, ctx) is None]


def test_docs_list_exactly_the_table():
    doc = (ROOT / "docs" / "engine.md").read_text()
    assert patches.markdown_table() in doc, "docs/engine.md is stale: run python -m stagedyolo.engine.patches"
    assert len({p.name for p in PATCHES}) == len(PATCHES)


def test_schema_offers_the_table_modes_and_skippable_rows():
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    engine = schema["properties"]["engine"]["properties"]
    assert tuple(engine["mode"]["enum"]) == patches.MODES and engine["mode"]["default"] == patches.DEFAULT_MODE
    assert tuple(engine["skip_patches"]["items"]["enum"]) == patches.SKIPPABLE
    assert schema["$defs"]["stage"]["properties"]["engine_mode"]["enum"] == [*patches.MODES, None]


def test_reproducible_applies_no_fast_row_and_fast_on_cpu_only_the_cpu_rows():
    reproducible = applied(ctx_for("reproducible"))
    assert not {p.name for p in PATCHES if p.fast_only} & set(reproducible)
    assert set(applied(ctx_for("fast"))) - set(reproducible) == {"final_validation", "foreach_ema", "fused_optimizer"}
    on_cuda = set(applied(ctx_for("fast", device="", compile=True))) - set(reproducible)
    assert on_cuda == {
        "sync_every_batches",
        "final_validation",
        "nondeterministic",
        "channels_last",
        "compile",
        "foreach_ema",
        "fused_optimizer",
    }
    assert "compile" not in applied(ctx_for("fast", device=""))  # its own switch, off by default
    skipped = ctx_for("fast", skip=frozenset({"foreach_ema"}))
    assert "foreach_ema" not in applied(skipped)
    assert skip_reason(PATCHES[[p.name for p in PATCHES].index("channels_last")], ctx_for()) == (
        "CUDA only: the stage runs on the CPU"
    )


def test_a_job_names_only_rows_of_the_table():
    from stagedyolo.engine.patches import apply_job_patches

    with pytest.raises(ValueError, match="no such patch row"):
        apply_job_patches(("onnx_exporter_typo",))  # refused before any row is applied to this process


def test_a_stage_engine_mode_overrides_the_run_and_reaches_the_plan(tmp_path):
    from stagedyolo.recipe import stage_spec

    config = {
        "device": "cpu",
        "engine": {"mode": "fast", "skip_patches": ["fused_optimizer"]},
        "stage_defaults": {"engine_mode": None},
        "stages": {"a": {}, "b": {"engine_mode": "reproducible"}},
    }
    assert stage_spec(config, "a")["engine"] == {"mode": "fast", "compile": False, "skip_patches": ["fused_optimizer"]}
    spec = {**SPEC, "engine": stage_spec(config, "b")["engine"]}
    plan = small_stage_plan(spec, tmp_path, stage="b")
    assert plan["engine"]["mode"] == "reproducible"


def _yolov5n():
    from yolov5.models.yolo import Model

    torch.manual_seed(0)
    return Model(_cfg(), ch=3, nc=2)


def _cfg():
    from stagedyolo.engine.options import yolov5_dir

    return str(yolov5_dir() / "models" / "yolov5n.yaml")


def test_foreach_ema_matches_yolov5s_update_bit_for_bit():
    from yolov5.utils.torch_utils import ModelEMA

    model = _yolov5n()
    plain, fast = ModelEMA(model), patches.foreach_model_ema(ModelEMA, torch)(model)
    for _step in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.01)
        model(torch.rand(2, 3, 64, 64))  # train mode: BatchNorm running stats (buffers) move too
        plain.update(model)
        fast.update(model)
    for (name, a), b in zip(plain.ema.state_dict().items(), fast.ema.state_dict().values()):
        assert torch.equal(a, b), name
    assert fast.updates == plain.updates == 3


def test_fused_optimizer_keeps_yolov5s_groups_and_hyperparameters():
    from yolov5.utils.torch_utils import smart_optimizer

    model = _yolov5n()
    ctx = ctx_for(torch=torch)
    ctx.train = SimpleNamespace(smart_optimizer=smart_optimizer)
    patches._fused_optimizer(ctx)
    plain = smart_optimizer(model, "SGD", 0.01, 0.9, 5e-4)
    fused = ctx.train.smart_optimizer(model, "SGD", 0.01, 0.9, 5e-4)
    assert type(fused) is type(plain) and len(fused.param_groups) == len(plain.param_groups) == 3
    for a, b in zip(plain.param_groups, fused.param_groups):
        assert b["fused"] is True
        assert {k: v for k, v in a.items() if k not in ("fused", "foreach")} == {
            k: v for k, v in b.items() if k not in ("fused", "foreach")
        }


def test_cuda_rows_change_seeding_memory_format_and_compile_through_their_seams():
    calls = []
    cudnn = SimpleNamespace(benchmark=False)
    fake_torch = SimpleNamespace(backends=SimpleNamespace(cudnn=cudnn), channels_last="NHWC")
    train = SimpleNamespace(
        init_seeds=lambda seed, deterministic=False: calls.append(("seed", seed, deterministic)),
        check_amp=lambda model: calls.append("check_amp") or True,
    )
    ctx = ctx_for(device="", compile=True, torch=fake_torch)
    ctx.train = train
    for name in ("nondeterministic", "channels_last", "compile"):
        PATCHES[[p.name for p in PATCHES].index(name)].apply(ctx)
    train.init_seeds(7, deterministic=True)
    assert calls == [("seed", 7, False)] and cudnn.benchmark is True

    model = SimpleNamespace(
        to=lambda memory_format: calls.append(("to", memory_format)), compile=lambda: calls.append("compile")
    )
    assert train.check_amp(model) is True
    assert calls[1:] == ["check_amp", ("to", "NHWC"), "compile"] and ctx.compile_applied


def _loss_trace(kind: str, plan: dict, tmp_path: Path, name: str) -> list:
    plan = {**plan, "work_dir": str(tmp_path / "work" / name), "attempt": 1, "resume_from": None}
    Path(plan["work_dir"]).mkdir(parents=True)
    write_json(Path(plan["work_dir"]) / "plan.json", plan)
    env = {
        **engine_environment(tmp_path / "engine"),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    out = tmp_path / f"{name}.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "loss_trace.py"),
            kind,
            str(Path(plan["work_dir"]) / "plan.json"),
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    steps = json.loads(out.read_text())
    assert len(steps) == 8  # 16 images / batch 4, 2 epochs
    return steps


def test_reproducible_mode_trains_bit_identically_to_yolov5_and_fast_mode_closely(tmp_path):
    data = write_demo_dataset(tmp_path / "data", DemoSpec(TARGET_CLASSES, 16, 8))
    plan = small_stage_plan(
        {**SPEC, "engine": {"mode": "reproducible", "compile": False, "skip_patches": []}},
        tmp_path,
        data=data,
        work_dir=tmp_path / "unused",
    )
    bare = _loss_trace("bare", plan, tmp_path, "bare")
    reproducible = _loss_trace("worker", plan, tmp_path, "reproducible")
    assert reproducible == bare  # exact floats, every step
    outcome = json.loads((tmp_path / "work" / "reproducible" / "outcome.json").read_text())
    assert outcome["engine_mode"] == "reproducible"
    assert not {p["name"] for p in outcome["patches"] if p["applied"]} & set(patches.SKIPPABLE)

    fast_plan = {**plan, "engine": {"mode": "fast", "compile": False, "skip_patches": []}}
    fast = _loss_trace("worker", fast_plan, tmp_path, "fast")
    outcome = json.loads((tmp_path / "work" / "fast" / "outcome.json").read_text())
    assert {p["name"] for p in outcome["patches"] if p["applied"]} >= {"foreach_ema", "fused_optimizer"}
    # The CPU's fast rows: foreach EMA (the same arithmetic) and the fused optimizer (its own kernel): close, and
    # not required to be identical.
    assert sum(fast, []) == pytest.approx(sum(bare, []), rel=1e-3)


def test_every_source_row_edits_the_installed_train_py_exactly_once(tmp_path):
    """The CUDA-only sync_every_batches edit included: a train.py it does not fit must fail here, not on a GPU."""
    import importlib.util

    import torch

    from stagedyolo.engine.continuation import Continuation
    from stagedyolo.engine.train_module import patched_source

    ctx = EngineContext(
        {"optimizer": "SGD", "nominal_batch": 64, "min_warmup_iters": 100, "img": 128, "val_img": 160},
        "",
        True,
        None,
        amp_dtype="bfloat16",
        torch=torch,
        continuation=Continuation(None, "SGD"),
    )
    # the bf16 edit applies with amp: bf16 on a GPU; the continuation edits wherever a worker runs
    for patch in (p for p in PATCHES if p.phase == "source"):
        assert skip_reason(patch, ctx) is None, patch.name
        patch.apply(ctx)
    edits = 5 + len(patches.VAL_IMG_EDITS) + len(patches.CONTINUATION_EDITS)
    assert len(ctx.source_edits) == edits and ctx.log_every == patches.LOG_EVERY
    source = Path(importlib.util.find_spec("yolov5.train").origin).read_text()
    edited = patched_source(source, ctx.source_edits)
    compile(edited, "train.py", "exec")
    assert "if i % _STAGEDYOLO_LOG_EVERY == 0 or i == nb - 1: pbar.set_description(" in edited
    assert "with torch.cuda.amp.autocast(amp, dtype=_STAGEDYOLO_AUTOCAST_DTYPE):" in edited
    assert patches.VAL_IMG_EDITS[0][1] in edited and "{_STAGEDYOLO_VAL_IMGSZ} val" in edited
    assert "if f is best and not _STAGEDYOLO_SKIP_FINAL_VALIDATION:" in edited
    assert set(ctx.module_names) == {
        "_STAGEDYOLO_NOMINAL_BATCH",
        "_STAGEDYOLO_MIN_WARMUP_ITERS",
        "_STAGEDYOLO_LOG_EVERY",
        "_STAGEDYOLO_AUTOCAST_DTYPE",
        "_STAGEDYOLO_SKIP_FINAL_VALIDATION",
        "_STAGEDYOLO_VAL_IMGSZ",
        "_STAGEDYOLO_CONTINUATION",
        "_STAGEDYOLO_EPOCHS_BEFORE",
    }
    assert ctx.module_names["_STAGEDYOLO_AUTOCAST_DTYPE"] is torch.bfloat16
    assert ctx.module_names["_STAGEDYOLO_VAL_IMGSZ"] == 160
    fp16 = ctx_for(device="")
    fp16.amp = True
    assert skip_reason(next(p for p in PATCHES if p.name == "amp_bf16"), fp16) is not None  # fp16: yolov5's source


def test_step_engine_gives_the_probe_the_step_rows_a_stage_of_that_engine_gets(monkeypatch):
    """The pieces of a training step the probe uses carry exactly the speed rows a stage of the same engine would:
    on CPU in fast mode the fused optimizer and the foreach EMA; on CUDA also cuDNN autotuning (through init_seeds,
    as train.py calls it) and channels_last (through check_amp, once the model is built); none in reproducible mode
    or where engine.skip_patches names a row."""
    from stagedyolo.engine.patches import step_engine

    fast = {"mode": "fast", "compile": False, "skip_patches": []}
    pieces, report = step_engine(fast, "AdamW", "cpu", torch)
    assert [r["name"] for r in report if r["applied"]] == ["foreach_ema", "fused_optimizer"]
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
    assert pieces.smart_optimizer(model, "AdamW", 0.01, 0.9, 0.0).defaults["fused"] is True
    from yolov5.utils.torch_utils import ModelEMA

    assert pieces.ModelEMA is not ModelEMA and issubclass(pieces.ModelEMA, ModelEMA)  # the foreach update

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    pieces, report = step_engine({**fast, "skip_patches": ["fused_optimizer"]}, "AdamW", "", torch)  # '' = CUDA
    assert [r["name"] for r in report if r["applied"]] == ["nondeterministic", "channels_last", "foreach_ema"]
    pieces.init_seeds(0, deterministic=True)
    assert torch.backends.cudnn.benchmark is True and not torch.are_deterministic_algorithms_enabled()
    pieces.check_amp(model)
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)

    _pieces, report = step_engine({**fast, "mode": "reproducible"}, "AdamW", "", torch)
    assert not any(r["applied"] for r in report)


def test_a_deferred_import_runs_its_module_on_first_use_not_on_import(tmp_path, monkeypatch):
    import importlib

    from stagedyolo.engine.compat import DeferredImports

    (tmp_path / "probe_deferred_sample.py").write_text("import os\nos.environ['PROBE_DEFERRED_RAN'] = '1'\nVALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("PROBE_DEFERRED_RAN", raising=False)
    finder = DeferredImports(("probe_deferred_sample",))
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    monkeypatch.delitem(sys.modules, "probe_deferred_sample", raising=False)
    importlib.invalidate_caches()
    import probe_deferred_sample

    assert "PROBE_DEFERRED_RAN" not in os.environ  # imported, not executed
    assert probe_deferred_sample.VALUE == 7 and os.environ["PROBE_DEFERRED_RAN"] == "1"  # executed on first use
    monkeypatch.delitem(sys.modules, "probe_deferred_sample")


def test_a_deferred_module_answers_what_import_and_inspect_read_without_running(tmp_path):
    """In a fresh process: inspect.getmodule's search of sys.modules (as torch's operator registrations run it), a
    second import and isinstance leave a deferred module unexecuted; its first real use executes it once; importing a
    deferred package's submodule executes the package first."""
    (tmp_path / "deferred_sample.py").write_text("import sys\nsys.ran.append('module')\nVALUE = 7\n")
    package = tmp_path / "deferred_package"
    package.mkdir()
    (package / "__init__.py").write_text("import sys\nsys.ran.append('package')\n")
    (package / "child.py").write_text("import sys\nsys.ran.append('child')\n")
    code = textwrap.dedent(f"""
        import inspect, sys, types
        sys.path.insert(0, {str(tmp_path)!r})
        sys.ran = []
        from stagedyolo.engine.compat import DeferredImports
        sys.meta_path.insert(0, DeferredImports(("deferred_sample", "deferred_package")))
        import deferred_sample
        inspect.getmodule(inspect.currentframe())  # reads every module's __file__ and class
        import deferred_sample as again
        print("unexecuted:", sys.ran, isinstance(again, types.ModuleType), type(again).__name__)
        print("used:", deferred_sample.VALUE, sys.ran, type(deferred_sample).__name__)
        import deferred_package.child
        print("package:", sys.ran)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [
        "unexecuted: [] True DeferredModule",
        "used: 7 ['module'] module",
        "package: ['module', 'package', 'child']",
    ], out


def test_yolov5_imports_with_the_import_shims_and_a_plot_still_loads_seaborn(tmp_path):
    """deferred_imports, sourceless_inspect and lazy_dynamo in a fresh process: train.py's and val.py's whole import
    chains leave seaborn (and scipy.stats), matplotlib.pyplot and boto3 unexecuted, and the first use of each executes
    it; yolov5.utils.general was executed by the sourceless-inspect loader, and inspect.stack is the real one again
    afterwards; torch._dynamo is not imported until roi_align's check asks for it, and the check answers as before."""
    code = textwrap.dedent("""
        import inspect, sys
        from stagedyolo.engine import compat
        compat.defer_imports()
        compat.sourceless_inspect()
        compat.lazy_dynamo_in_torchvision()
        real_stack = inspect.stack
        import torch, yolov5.train, yolov5.val
        print("dynamo:", "torch._dynamo" in sys.modules)
        roi_align = sys.modules["torchvision.ops.roi_align"]
        print("check:", roi_align.is_compile_supported("cpu"), "torch._dynamo" in sys.modules)
        def state():
            kinds = [type(sys.modules[name]).__name__ for name in ("seaborn", "matplotlib.pyplot", "boto3")]
            print("state:", *kinds, "scipy.stats" in sys.modules)
        state()
        import boto3, matplotlib.pyplot as plt, seaborn
        seaborn.color_palette()
        plt.figure()
        boto3.Session
        state()
        loader = type(sys.modules["yolov5.utils.general"].__loader__).__name__
        print("stack:", loader, inspect.stack is real_stack)
    """)
    env = engine_environment(tmp_path / "engine")
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    states = [line.split()[1:] for line in out.splitlines() if line.startswith("state:")]  # ultralytics prints too
    assert states == [["DeferredModule"] * 3 + ["False"], ["module"] * 3 + ["True"]], out
    assert "stack: _SourcelessInspectLoader True" in out.splitlines(), out
    assert "dynamo: False" in out.splitlines() and "check: True True" in out.splitlines(), out


def test_sourceless_inspect_reports_the_frames_filenames_lines_and_functions_inspect_does():
    import inspect

    from stagedyolo.engine.compat import sourceless_inspect_module, stack_without_source

    def both():
        return inspect.stack(), stack_without_source()

    full, sourceless = both()
    assert [(f.frame, f.filename, f.lineno, f.function) for f in sourceless] == [
        (f.frame, f.filename, f.lineno, f.function) for f in full
    ]
    assert all(f.code_context is None for f in sourceless)
    frame = inspect.currentframe()
    with_source, without = inspect.getframeinfo(frame), sourceless_inspect_module().getframeinfo(frame)
    assert without[:3] == (with_source.filename, with_source.lineno, with_source.function)
    assert without.code_context is None and with_source.code_context


def test_skip_exit_collection_runs_pending_finalizers_and_atexit_then_freezes_the_rest(tmp_path):
    """In a fresh process: garbage in a reference cycle when it is called is finalized by it (the teardown's
    collections, which would otherwise reclaim it, see frozen objects only), atexit handlers still run, and the
    objects left are frozen."""
    code = textwrap.dedent(f"""
        import atexit, gc, pathlib
        from stagedyolo.engine.compat import skip_exit_collection
        out = pathlib.Path({str(tmp_path)!r})
        class Cyclic:
            def __init__(self):
                self.me = self
            def __del__(self):
                (out / "finalized").write_text("yes")
        gc.disable()  # only skip_exit_collection may collect the cycle
        Cyclic()
        atexit.register(lambda: (out / "atexit").write_text("yes"))
        skip_exit_collection()
        (out / "frozen").write_text(str(gc.get_freeze_count() > 0))
    """)
    subprocess.run([sys.executable, "-c", code], check=True)
    assert [(tmp_path / name).read_text() for name in ("finalized", "atexit", "frozen")] == ["yes", "yes", "True"]


def handover_checkpoint(path: Path) -> str:
    """A stage's continue.pt as train.py saves one (model, EMA, update count, optimizer state, opt)."""
    from yolov5.models.yolo import Model

    from stagedyolo.engine.options import yolov5_dir

    model = Model(str(yolov5_dir() / "models" / "yolov5n.yaml"), ch=3, nc=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.005)
    torch.save(
        {
            "epoch": 1,
            "best_fitness": 0.1,
            "model": model.half(),
            "ema": model,
            "updates": 8,
            "optimizer": optimizer.state_dict(),
            "opt": {"optimizer": "SGD", "imgsz": 64},
        },
        path,
    )
    return str(path)


@pytest.mark.parametrize("continues", [False, True], ids=["first stage", "continuing stage"])
def test_the_worker_applies_the_process_rows_before_it_first_imports_yolov5(tmp_path, continues):
    """The import shims act only on imports still to come: in a fresh process, the worker's load_engine imports
    yolov5.utils.general through the sourceless-inspect loader and applies every row; seaborn, pyplot and boto3 stay
    deferred through train.main's first log line (print_args), which reads the same as yolov5's own. A continuing
    stage reads its handover (which unpickles yolov5's model classes) only once the shims are in place."""
    weights = handover_checkpoint(tmp_path / "continue.pt") if continues else None
    spec = {**SPEC, "continues": continues, "lr_from_previous": continues}
    plan = small_stage_plan(spec, tmp_path, stage="a", weights=weights)
    write_json(tmp_path / "plan.json", plan)
    # Called from a module imported late, as train.main's module is: inspect has not mapped its file to a module
    # yet, so reading its source would search sys.modules.
    (tmp_path / "first_log_line.py").write_text("def log(print_args):\n    print_args({'epochs': 3})\n")
    script = tmp_path / "stage.py"
    script.write_text(
        textwrap.dedent("""
        import json, sys, torch
        from stagedyolo.engine.worker import load_engine
        engine, patches, amp, taken_up = load_engine(json.load(open(sys.argv[1])), torch)
        import first_log_line
        first_log_line.log(engine.train.print_args)
        general = sys.modules["yolov5.utils.general"]
        deferred = [type(sys.modules[name]).__name__ for name in ("seaborn", "matplotlib.pyplot", "boto3")]
        print("state:", *deferred, type(general.__loader__).__name__)
        print("rows:", " ".join(row["name"] for row in patches))
        print("lr0:", engine.plan["hyp"]["lr0"], taken_up and taken_up["lr0_source"])
        engine.train.init_seeds(0, deterministic=True)  # as train.py starts every stage, then one step
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
        optimizer = engine.train.smart_optimizer(model, engine.plan["optimizer"], 0.01, 0.9, 1e-5)
        model(torch.rand(2, 3, 8, 8)).sum().backward()
        optimizer.step(), optimizer.zero_grad(), optimizer.load_state_dict(optimizer.state_dict())
        compiler = [name in sys.modules for name in ("torch._dynamo", "torch._inductor")]
        print("trained:", torch.are_deterministic_algorithms_enabled(), torch.is_grad_enabled(), *compiler)
    """)
    )
    env = engine_environment(tmp_path / "engine")
    run = subprocess.run(
        [sys.executable, "-W", "ignore", str(script), str(tmp_path / "plan.json")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    out = run.stdout + run.stderr
    prefixes = ("state:", "rows:", "lr0:", "trained:")
    lines = dict(line.split(": ", 1) for line in out.splitlines() if line.startswith(prefixes))
    assert lines["trained"] == "True True False False", out  # seeded and stepped; the compiler never loaded
    assert lines["state"] == "DeferredModule DeferredModule DeferredModule _SourcelessInspectLoader", out
    assert lines["rows"].split() == [p.name for phase in patches.PHASES for p in PATCHES if p.phase == phase]
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)  # colorstr's colours
    assert "first_log_line: epochs=3" in plain  # yolov5's own format: the caller's file stem, then the arguments
    expected = "0.005 the previous stage's handover" if continues else f"{SPEC['lr0']} None"
    assert lines["lr0"] == expected  # the NaN guard and the hyp file read the LR the stage takes up


def test_compiler_unloaded_steps_as_torch_does_and_sets_the_flags():
    """In a fresh process: SGD and AdamW steps after the row give the weights torch's own wrappers give, with grad
    mode restored and torch._dynamo never imported; the deterministic flag reaches torch, and inductor's config once
    a process imported it. With engine.compile the row is off."""
    code = textwrap.dedent("""
        import sys, types, torch
        from stagedyolo.engine import compat
        def two_steps(optimizer_class, **options):
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 2)
            optimizer = optimizer_class(model.parameters(), lr=0.1, **options)
            for _ in range(2):
                model(torch.ones(3, 4)).square().sum().backward()
                optimizer.step()
                optimizer.zero_grad()
            optimizer.load_state_dict(optimizer.state_dict())
            return model.weight.detach().clone()
        cases = [(torch.optim.SGD, {"momentum": 0.9, "nesterov": True}), (torch.optim.AdamW, {"weight_decay": 0.01})]
        found = compat.compiler_wrapped_optimizer_methods()
        compat.compiler_left_unloaded()
        after = [two_steps(cls, **options) for cls, options in cases]
        print("after:", len(found) > 0, compat.compiler_wrapped_optimizer_methods(), torch.is_grad_enabled(),
              "torch._dynamo" in sys.modules)
        inductor_config = sys.modules[compat.INDUCTOR_CONFIG] = types.SimpleNamespace(deterministic=False)
        torch.use_deterministic_algorithms(True, warn_only=True)
        print("flags:", torch.are_deterministic_algorithms_enabled(), inductor_config.deterministic)
        del sys.modules[compat.INDUCTOR_CONFIG]
        import inspect, torch._dynamo  # the reference: torch's own step wrapper, on a subclass of each
        from torch.optim.optimizer import _use_grad_for_differentiable
        for cls, options in cases:
            reference = type(cls.__name__, (cls,), {"step": _use_grad_for_differentiable(inspect.unwrap(cls.step))})
            print("same:", torch.equal(after.pop(0), two_steps(reference, **options)))
    """)
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["after: True [] True False", "flags: True True", "same: True", "same: True"]
    row = PATCHES[[p.name for p in PATCHES].index("compiler_unloaded")]
    assert skip_reason(row, ctx_for("fast", device="", compile=True)) == (
        "engine.compile is true: the compiler loads and traces"
    )


def test_local_weights_answer_none_for_a_file_or_no_weights_and_ask_yolov5_for_anything_else(tmp_path, monkeypatch):
    """The row answers for train.py's own call and for attempt_download's, in yolov5's downloads module."""
    from yolov5.utils import downloads

    asked = []
    monkeypatch.setattr(downloads, "attempt_download_from_hub", lambda repo_id, **kw: asked.append(repo_id) or "h.pt")
    train = SimpleNamespace(attempt_download=downloads.attempt_download, attempt_download_from_hub=None)
    ctx = ctx_for("reproducible")
    ctx.train = train
    patches._local_weights(ctx)
    weights = tmp_path / "last.pt"
    weights.write_bytes(b"")
    assert train.attempt_download_from_hub is downloads.attempt_download_from_hub
    assert train.attempt_download_from_hub(str(weights)) is None
    assert train.attempt_download_from_hub("") is None
    assert train.attempt_download_from_hub("keremberke/yolov5n-license-plate") == "h.pt"
    assert asked == ["keremberke/yolov5n-license-plate"]
