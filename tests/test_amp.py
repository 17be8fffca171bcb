"""The AMP policy: on with CUDA unless at least 20 steps per side show AMP >= 10 % slower; bf16 where supported."""

from stagedyolo.engine.amp import AMP_MIN_STEPS, amp_verdict, decide_amp


def run(batch, amp, rate, steps=AMP_MIN_STEPS, threads=1):
    return {"batch": batch, "amp": amp, "images_per_s": rate, "steps": steps, "torch_threads": threads, "status": "ok"}


def test_amp_stays_on_when_short_runs_say_it_is_slower():
    # The H200 probe's evidence: 3 and 6 timed steps, AMP 411 vs fp32 591 images/s. Too few steps to turn it off.
    verdict = amp_verdict([run(64, True, 411.0, steps=3), run(64, False, 591.0, steps=6)], cuda=True)
    assert verdict["amp"] is True and "on with CUDA" in verdict["reason"]
    assert verdict["evidence"] == [
        {"batch": 64, "amp_images_per_s": 411.0, "fp32_images_per_s": 591.0, "amp_steps": 3, "fp32_steps": 6}
    ]


def test_amp_is_turned_off_only_when_clearly_slower_at_every_batch():
    slower = [run(32, True, 80.0), run(32, False, 100.0), run(64, True, 85.0), run(64, False, 100.0)]
    verdict = amp_verdict(slower, cuda=True)
    assert verdict["amp"] is False and "80.0 vs 100.0" in verdict["reason"]
    slightly = [run(32, True, 91.0), run(32, False, 100.0)]  # 9 % slower: within the margin, AMP stays on
    assert amp_verdict(slightly, cuda=True)["amp"] is True
    mixed = [run(32, True, 80.0), run(32, False, 100.0), run(64, True, 120.0), run(64, False, 100.0)]
    assert amp_verdict(mixed, cuda=True)["amp"] is True


def test_no_amp_on_cpu_and_every_setting_says_why():
    assert amp_verdict([run(16, False, 50.0)], cuda=False)["amp"] is False
    assert decide_amp("auto", cuda=False) == {"amp": False, "dtype": None, "reason": "off on CPU (AMP needs CUDA)"}
    forced = decide_amp(True, cuda=False)
    assert forced["amp"] is False and "CPU" in forced["reason"] and "true from config" in forced["reason"]
    assert decide_amp("bf16", cuda=False)["amp"] is False
    assert decide_amp(False, cuda=False, source="probe")["reason"] == "off on CPU (AMP needs CUDA)"


def test_cuda_settings_and_bf16():
    assert decide_amp("auto", cuda=True) == {"amp": True, "dtype": "float16", "reason": "auto: on with CUDA"}
    assert decide_amp(False, cuda=True, source="probe")["reason"] == "amp: false from probe"
    assert decide_amp("bf16", cuda=True, bf16_supported=True)["dtype"] == "bfloat16"
    fallback = decide_amp("bf16", cuda=True, bf16_supported=False)
    assert fallback["amp"] is True and fallback["dtype"] == "float16" and "lacks bfloat16" in fallback["reason"]
