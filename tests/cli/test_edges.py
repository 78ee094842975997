"""Bad input at the real `eagle3lab` command gives one clear message and an exit code, never
a traceback: each planted case names the file (and line or field) and the problem, and
the refusals that need no model come before any model is loaded (the targets given to
those commands do not exist, so loading one would fail with another message)."""

import json
import shutil

import pytest

from eagle3lab.cli import main


def run(args, capsys, code=1):
    """`eagle3lab ARGS`: assert the exit code and no traceback; return stderr."""
    rc = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert rc == code, err
    return err


@pytest.fixture()
def shards(tmp_path, sharp_data):
    """A private copy of the sharp train shards (with their vocab map), to damage."""
    return shutil.copytree(sharp_data["train"], tmp_path / "train")


def _train(shards, sharp_data, tmp_path, *extra):
    return ["train", "--data", shards, "--eval-data", sharp_data["eval"], "--out",
            tmp_path / "run", "--max-steps", "1", "--no-progress", *extra]


# --- input files -------------------------------------------------------------------------
def test_a_prompts_line_that_is_a_json_list(tmp_path, capsys):
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"id": "a", "prompt": "hi"}\n["not", "an", "object"]\n')
    err = run(["regenerate", "--prompts", bad, "--out", tmp_path / "o.jsonl",
               "--target", tmp_path / "no-target"], capsys)
    assert f"{bad}, line 2: expected a JSON object" in err and "found a JSON array" in err


def test_string_token_ids_in_a_conversations_file(tmp_path, capsys):
    bad = tmp_path / "convs.jsonl"
    bad.write_text(json.dumps({"id": "x", "input_ids": [1, "5"], "loss_mask": [0, 1]}) + "\n")
    err = run(["extract", "--conversations", bad, "--out", tmp_path / "s",
               "--target", tmp_path / "no-target"], capsys)
    assert f'{bad}, line 1: input_ids[1] is "5"' in err and "not a string" in err


def test_a_non_utf8_conversations_file(tmp_path, capsys):
    bad = tmp_path / "convs.jsonl"
    good = json.dumps({"id": "x", "input_ids": [1, 2], "loss_mask": [0, 1]})
    bad.write_bytes(good.encode() + b"\n" + b'{"id": "caf\xe9"}\n')
    err = run(["extract", "--conversations", bad, "--out", tmp_path / "s",
               "--target", tmp_path / "no-target"], capsys)
    assert f"{bad}, line 2: not UTF-8 text (byte 0xe9" in err


def test_a_non_utf8_prompts_file(tmp_path, capsys):
    bad = tmp_path / "prompts.jsonl"
    bad.write_bytes(b'{"prompt": "\xff\xfe"}\n')
    err = run(["accept", "--prompts", bad, "--draft", tmp_path, "--target",
               tmp_path / "no-target"], capsys)
    assert "is not a readable EAGLE-3 drafter checkpoint: config.json: config.json is " \
           "missing" in err
    err = run(["regenerate", "--prompts", bad, "--out", tmp_path / "o.jsonl",
               "--target", tmp_path / "no-target"], capsys)
    assert f"{bad}, line 1: not UTF-8 text (byte 0xff" in err


def test_extract_samples_per_shard_0(tmp_path, capsys):
    convs = tmp_path / "convs.jsonl"
    convs.write_text(json.dumps({"id": "x", "input_ids": [1, 2], "loss_mask": [0, 1]}) + "\n")
    err = run(["extract", "--conversations", convs, "--out", tmp_path / "s",
               "--target", tmp_path / "no-target", "--samples-per-shard", "0"], capsys)
    assert "samples_per_shard (--samples-per-shard) must be a whole number of at least 1, " \
           "got 0" in err
    assert not (tmp_path / "s").exists()


# --- shards and the vocab map ------------------------------------------------------------
def test_a_deleted_shard(shards, sharp_data, tmp_path, capsys):
    (shards / "shard-00000.safetensors").unlink()
    err = run(_train(shards, sharp_data, tmp_path), capsys)
    assert f"Shard {shards / 'shard-00000.safetensors'} is listed in" in err and "missing" in err
    assert not (tmp_path / "run" / "run.json").exists()
    err = run(["vocab", "--data", shards, "--force"], capsys)
    assert "shard-00000.safetensors is listed in" in err


def test_a_truncated_shard(shards, sharp_data, tmp_path, capsys):
    shard = shards / "shard-00000.safetensors"
    size = shard.stat().st_size
    with open(shard, "rb+") as f:
        f.truncate(size // 2)
    err = run(["vocab", "--data", shards, "--force"], capsys)
    assert f"Shard {shard} is corrupt ({size // 2} bytes, the manifest recorded {size}" in err
    # without verification the damage still surfaces as a clear error, not a traceback
    err = run(["vocab", "--data", shards, "--force", "--no-verify"], capsys)
    assert f"Shard {shard} (listed in {shards / 'manifest.json'}) cannot be read" in err
    err = run(_train(shards, sharp_data, tmp_path, "--no-verify"), capsys)
    assert f"Shard {shard}" in err and "cannot be read" in err


def test_a_deleted_vocab_map(shards, sharp_data, tmp_path, capsys):
    (shards / "vocab_map.safetensors").unlink()
    err = run(_train(shards, sharp_data, tmp_path), capsys)
    assert f"The vocab map {shards / 'vocab_map.safetensors'} is listed in" in err
    assert "missing; rebuild it with `eagle3lab vocab" in err
    # `vocab` rebuilds it rather than trusting the manifest entry of a deleted file
    run(["vocab", "--data", shards, "--draft-vocab-size", "64"], capsys, code=0)
    assert (shards / "vocab_map.safetensors").is_file()


# --- configs and outputs -----------------------------------------------------------------
def test_train_config_holding_a_json_list(shards, sharp_data, tmp_path, capsys):
    cfg = tmp_path / "cfg.json"
    cfg.write_text('[{"lr": 0.001}]\n')
    err = run(_train(shards, sharp_data, tmp_path, "--config", cfg), capsys)
    assert f"The --config file {cfg} holds a JSON array (a list), not an object" in err
    cfg.write_bytes(b'{"lr": "\xff"}')
    err = run(_train(shards, sharp_data, tmp_path, "--config", cfg), capsys)
    assert f"The --config file {cfg} is not UTF-8 text" in err
    cfg.write_text('{"lr": 0.001,}')
    err = run(_train(shards, sharp_data, tmp_path, "--config", cfg), capsys)
    assert f"The --config file {cfg} is not valid JSON (line 1, column 14" in err


def test_convert_to_a_dst_that_is_an_existing_file(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    dst = tmp_path / "out.safetensors"
    dst.write_bytes(b"keep me")
    for force in ([], ["--force"]):
        err = run(["convert", src, dst, "--to", "sglang", *force], capsys)
        assert f"DST {dst} is an existing file, not a directory" in err
    assert dst.read_bytes() == b"keep me"


@pytest.mark.parametrize("kind", ["conversations", "prompts"])
def test_a_corrupt_meta_file(tmp_path, capsys, kind):
    out = tmp_path / "out.jsonl"
    out.write_text("")
    meta = tmp_path / "out.jsonl.meta.json"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    cmd = (["regenerate", "--prompts", prompts] if kind == "conversations"
           else ["self-prompt", "--n", "2"]) + ["--out", out, "--target", tmp_path / "none"]
    meta.write_text('{"kind": "eagle3lab-%s", "params": {' % kind)  # torn
    err = run(cmd, capsys)
    assert f"The meta file {meta} is not valid JSON (line 1" in err
    assert "delete both files to start over, or choose a new --out" in err
    meta.write_text("[]")
    err = run(cmd, capsys)
    assert f"The meta file {meta} holds a JSON array" in err
    other = "prompts" if kind == "conversations" else "conversations"
    meta.write_text(json.dumps({"kind": f"eagle3lab-{other}", "params": {}}))
    err = run(cmd, capsys)
    assert f"The meta file {meta} is not a eagle3lab-{kind} meta file" in err


def test_train_resume_with_a_corrupt_run_record(shards, sharp_data, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text('{"status": "runn')
    err = run(_train(shards, sharp_data, tmp_path, "--resume"), capsys)
    assert f"The run record {tmp_path / 'run' / 'run.json'} is not valid JSON" in err


# --- accept --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory, tiny_target_dir):
    from eagle3lab.formats.demo import make_speculators_draft

    return make_speculators_draft(tmp_path_factory.mktemp("d") / "draft",
                                  target=tiny_target_dir, draft_vocab=512)


def test_accept_limit_0(tiny_draft, tmp_path, capsys):
    err = run(["accept", "--draft", tiny_draft, "--target", tmp_path / "none", "--limit", "0"],
              capsys)
    assert "limit (--limit) must be a whole number of at least 1" in err and "got 0" in err


def test_accept_checks_the_draft_before_loading_the_target(tiny_target_dir, tmp_path, capsys):
    missing = tmp_path / "no-draft"
    for extra in ([], ["--compare-failures"]):
        err = run(["accept", "--draft", missing, "--target", tmp_path / "none", *extra], capsys)
        assert f"The drafter '{missing}' does not exist" in err
    err = run(["accept", "--draft", tiny_target_dir, "--target", tmp_path / "none"], capsys)
    assert f"{tiny_target_dir} is not a readable EAGLE-3 drafter checkpoint: its config" in err
    (tmp_path / "f").write_text("x")
    err = run(["accept", "--draft", tmp_path / "f", "--target", tmp_path / "none"], capsys)
    assert "is a file; a drafter checkpoint is a directory" in err
    # the library function checks first too (notebooks call it)
    from eagle3lab.errors import UserError
    from eagle3lab.specdec.accept import measure_acceptance

    with pytest.raises(UserError, match="does not exist"):
        measure_acceptance(target=str(tmp_path / "none"), draft=str(missing), progress=False)


def _shard_checkpoint(src, dst):
    """A copy of `src` with its weights split over two files and an index, as large
    drafters are published."""
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    tensors = load_file(str(src / "model.safetensors"))
    names = sorted(tensors)
    half = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
            "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for file, keys in half.items():
        save_file({k: tensors[k] for k in keys}, str(dst / file), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: f for f, ks in half.items() for k in ks}}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return dst


def test_accept_compare_failures_on_a_sharded_drafter(tiny_draft, tiny_target_dir, tmp_path,
                                                      capsys):
    from eagle3lab.formats.convert import convert_checkpoint

    sglang = convert_checkpoint(tiny_draft, tmp_path / "sglang", to="sglang",
                                target=tiny_target_dir).path
    sharded = _shard_checkpoint(sglang, tmp_path / "sharded")
    assert not (sharded / "model.safetensors").exists()
    rc = main(["accept", "--target", str(tiny_target_dir), "--draft", str(sharded),
               "--compare-failures", "--limit", "1", "--max-new-tokens", "4", "--steps", "2",
               "--json"])
    out, err = capsys.readouterr()
    assert rc == 0 and "Traceback" not in err, err
    arms = {a["name"]: a for a in json.loads(out)["arms"]}
    assert set(arms) == {"draft", "last_layer features", "sglang config + layers.0 keys"}
    assert arms["draft"]["matches_plain"] == 1


def test_accept_static_engine_batched(tiny_draft, tiny_target_dir, capsys):
    """`--engine static --batch-size 2` on the CPU: the same counts as the eager engine, the
    batch throughput printed; bad values are one line each."""
    base = ["accept", "--target", str(tiny_target_dir), "--draft", str(tiny_draft),
            "--limit", "3", "--max-new-tokens", "5", "--steps", "2"]
    rc = main(base + ["--json"])
    eager = json.loads(capsys.readouterr()[0])
    rc = main(base + ["--engine", "static", "--batch-size", "2", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0 and "Traceback" not in err, err
    static = json.loads(out)
    assert static["settings"]["engine"] == "static" and static["settings"]["batch_size"] == 2
    for key in ("accept_histogram", "verify_ct", "completion_tokens"):
        assert static["arms"][0]["stats"][key] == eager["arms"][0]["stats"][key]
    assert [r["name"] for r in static["batch"]["runs"]] == ["plain", "draft"]
    rc = main(base + ["--engine", "static", "--batch-size", "2"])
    out, _ = capsys.readouterr()
    assert rc == 0 and "batch 2 (throughput over the whole run" in out and "prompts/min" in out \
        and "graph captures 0.0 s" in out
    err = run(base + ["--batch-size", "0", "--engine", "static"], capsys)
    assert "batch size (--batch-size) must be a whole number of at least 1, got 0" in err
    err = run(base + ["--batch-size", "2", "--engine", "eager"], capsys)
    assert "batch size > 1 needs the static engine (--engine static)" in err


# --- the last resort -----------------------------------------------------------------------
def test_an_unexpected_error_is_one_line_exit_2(shards, monkeypatch, capsys):
    from eagle3lab.data import shards as shards_module

    def broken_disk(self, *, cache=True):
        raise PermissionError(13, "Permission denied", str(self.path / "shard-00000.safetensors"))

    monkeypatch.setattr(shards_module.ShardSet, "verify", broken_disk)
    err = run(["vocab", "--data", shards, "--force"], capsys, code=2)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("eagle3lab vocab: unexpected error: PermissionError: ")
    assert str(shards / "shard-00000.safetensors") in lines[0]
    assert "[in eagle3lab/" in lines[0] and "--debug" in lines[0]
    rc = main(["--debug", "vocab", "--data", str(shards), "--force"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback (most recent call last)" in err and "broken_disk" in err


def test_help_documents_the_exit_codes_and_debug(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--debug" in out and "1 bad input" in out and "2 a usage error, or an unexpected " \
           "error" in out


def test_debug_shows_the_traceback_of_a_user_error_too(tmp_path, capsys):
    rc = main(["--debug", "vocab", "--data", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" in err and "eagle3lab vocab: error: Data directory" in err


def test_the_installed_command_exits_2_without_a_traceback(tmp_path):
    """The console entry point (`python -m eagle3lab`), in a fresh process."""
    import subprocess
    import sys

    # a shard set whose manifest lists a shard entry without its fields: not a planted
    # case with its own check, so the top-level catch answers
    d = tmp_path / "s"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"format": "eagle3lab-shards", "version": 1,
                                                 "shards": [{"file": "x"}]}))
    r = subprocess.run([sys.executable, "-m", "eagle3lab", "vocab", "--data", str(d)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("eagle3lab vocab: unexpected error: KeyError: 'samples'")
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_reader_that_leaves_early_is_not_an_error():
    """`eagle3lab logs LOG | head -1`: a command printing many lines whose reader closes the
    pipe after one line exits 0 through `cli.guarded`, without an 'unexpected error:
    BrokenPipeError' line."""
    import subprocess
    import sys

    body = ("import sys; from eagle3lab.cli import guarded\n"
            "def chatty():\n    for i in range(200000):\n        print('line', i)\n"
            "sys.exit(guarded('eagle3lab logs', chatty, debug=False, debug_hint=''))\n")
    proc = subprocess.Popen([sys.executable, "-c", body], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"line 0\n"
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "BrokenPipeError" not in err and "unexpected error" not in err, err
