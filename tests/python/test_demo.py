"""The demo end to end at a tiny size: the table, the results and the picture are produced, and every optimizer's
loss goes down."""
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")
pytest.importorskip("tqdm")
demo = pytest.importorskip("lbopt.demo")


def test_demo_smoke(tmp_path):
    try:
        demo.load_corpus(None)
    except SystemExit:
        pytest.skip("the fortunes corpus is not installed (apt-get install fortunes)")
    out = tmp_path / "demo"
    results = demo.main(["--steps", "24", "--d-model", "64", "--layers", "1", "--heads", "2", "--context", "32",
                         "--batch", "8", "--eval-every", "12", "--val-batches", "2", "--max-chars", "200000",
                         "--threads", "1", "--optimizers", "fp32,lbopt-8bit,lbopt-4bit,lbopt-muon4bit", "--out",
                         str(out)])
    assert [r["name"] for r in results] == ["fp32", "lbopt-8bit", "lbopt-4bit", "lbopt-muon4bit"]
    table = (out / "table.md").read_text()
    for label in ("torch AdamW (fp32)", "lbopt AdamW8bit", "lbopt AdamW4bit", "lbopt Muon4bit + AdamW4bit",
                  "val loss", "state MiB"):
        assert label in table
    png = (out / "demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    saved = json.loads((out / "results.json").read_text())
    for r in saved["results"]:
        first, last = r["val_curve"][0][1], r["val_curve"][-1][1]
        assert last < first, r["name"]
        assert r["train_curve"][-1] < r["train_curve"][0], r["name"]
    by = {r["name"]: r for r in saved["results"]}
    # 4-bit states are the smallest, fp32 the largest (state bytes measured from the tensors)
    assert by["lbopt-4bit"]["state_bytes"] < by["lbopt-8bit"]["state_bytes"] < by["fp32"]["state_bytes"]
    # Muon keeps one state where AdamW keeps two: its 4-bit pairing is smaller still
    assert by["lbopt-muon4bit"]["state_bytes"] < by["lbopt-4bit"]["state_bytes"]
