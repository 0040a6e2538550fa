"""scripts/demo.py around the front end: a failed `dgx-stage stage` is reported with its exit code."""
import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_demo():
    spec = importlib.util.spec_from_file_location("demo_script", os.path.join(REPO, "scripts", "demo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_stage_usage_error_is_reported_not_a_traceback(tmp_path, monkeypatch, capsys):
    # `make demo` with a bad argument: dgx-stage exits 64 and records no run; the demo read "the latest
    # run" first and died with FileNotFoundError (or showed an older run's recap).
    demo = load_demo()
    monkeypatch.setattr(demo, "RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr(demo, "ensure_nas_hub", lambda: None)
    monkeypatch.setattr(demo.subprocess, "call", lambda *a, **k: 64)
    monkeypatch.setattr(demo.sys, "argv", ["demo.py", "--frob"])
    assert demo.main() == 64
    assert "dgx-stage stage failed (exit 64)" in capsys.readouterr().out
