"""The doctor, `convert` and `accept` on what the at-scale trainers write: SpecForge's
exported drafters (`specforge export --to sglang|hf`, written as SpecForge writes them:
specforge_writers.py), its step checkpoints (refused with the export command, never
unpickled), and speculators' epoch checkpoints written by speculators' own
SingleGPUCheckpointer; and `convert --to speculators` against speculators' own converter on
the same SGLang-format input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle3lab.cli import main as cli
from eagle3lab.errors import UserError
from eagle3lab.formats.convert import convert_checkpoint
from eagle3lab.formats.detect import parse_draft_config
from eagle3lab.formats.doctor import inspect_checkpoint
from eagle3lab.formats.locate import locate_checkpoint, speculators_epochs

sys.path.insert(0, str(Path(__file__).parent))
from specforge_writers import draft_state_from_speculators, export, step_checkpoint  # noqa: E402


def save_speculators_epochs(spec_dir, save_path, *, epochs=2, best=1, steps_per_epoch=5):
    """speculators' trainer around its SingleGPUCheckpointer: save_checkpoint (model +
    optimizer), save_scheduler_state_dict, training_state.json, epoch{E}_end links,
    save_val_metrics + update_best_symlink for the best epoch."""
    import os

    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.checkpointer import SingleGPUCheckpointer

    model = Eagle3DraftModel.from_pretrained(str(spec_dir))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    ck = SingleGPUCheckpointer(save_path)
    for epoch in range(epochs):
        ck.save_checkpoint(model, opt, epoch)
        ck.save_scheduler_state_dict(sched, epoch)
        (Path(save_path) / str(epoch) / "training_state.json").write_text(json.dumps(
            {"epoch": epoch, "local_step": 0, "global_step": (epoch + 1) * steps_per_epoch}))
        os.symlink(str(epoch), Path(save_path) / f"epoch{epoch}_end")
        if epoch == best:
            ck.save_val_metrics(epoch, {"loss_epoch": 1.25})
            ck.update_best_symlink(epoch)
    return Path(save_path)


@pytest.fixture(scope="module")
def foreign(fx, tmp_path_factory):
    root = tmp_path_factory.mktemp("foreign-ckpt")
    state = draft_state_from_speculators(fx["spec"])
    return {"state": state,
            "sglang": export(state, root / "sf-sglang", target_dir=fx["target"]),
            "hf": export(state, root / "sf-hf", target_dir=fx["target"], to="hf"),
            "save": save_speculators_epochs(fx["spec"], root / "save")}


def test_specforge_exports_pass_the_doctor(foreign, fx):
    """Both exports are SGLang-format drafters: every tensor is where SGLang and vLLM read
    it; the only finding is that nothing records the aux layers (SpecForge writes none)."""
    for kind in ("sglang", "hf"):
        for engine in ("sglang", "vllm"):
            r = inspect_checkpoint(foreign[kind], target=fx["target"], engine=engine)
            assert r.format == "eagle3" and r.ok, (kind, engine, r.table())
            assert r.codes == ["aux-layers"], (kind, engine, r.codes)
    names = {t["name"] for t in inspect_checkpoint(foreign["hf"]).tensors}
    assert "embed_tokens.weight" in names and "t2d" in names


def test_convert_matches_speculators_own_converter(foreign, fx, tmp_path):
    """`eagle3lab convert --to speculators` and speculators' Eagle3Converter (the Python API
    behind `speculators convert --algorithm eagle3`) on the same SpecForge export: the same
    tensor names and values, and a config that every reader takes the same way. One
    difference is speculators': it reads the dtype from `torch_dtype` only, which
    transformers 5 no longer writes (`dtype`), so it saves the bf16 export as float32;
    eagle3lab copies the bytes."""
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    ours = convert_checkpoint(foreign["sglang"], tmp_path / "ours", to="speculators",
                              target=fx["target"]).path
    theirs = tmp_path / "theirs"
    Eagle3Converter().convert(str(foreign["sglang"]), str(theirs), base_model=str(fx["target"]),
                              validate=True)
    a, b = (load_file(str(p / "model.safetensors")) for p in (ours, theirs))
    src = load_file(str(foreign["sglang"] / "model.safetensors"))
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k].to(b[k].dtype), b[k]), k
        assert torch.equal(a[k], src[k.replace("layers.0.", "midlayer.")]), k  # bytes kept
    assert {str(v.dtype) for k, v in b.items() if v.is_floating_point()} == {"torch.float32"}
    ca, cb = (json.loads((p / "config.json").read_text()) for p in (ours, theirs))
    for key in ("speculators_model_type", "draft_vocab_size", "target_hidden_size",
                "eagle_aux_hidden_state_layer_ids", "norm_before_fc", "norm_before_residual",
                "fc_norm", "norm_output", "tie_word_embeddings", "speculators_config"):
        assert ca[key] == cb[key], key
    la, lb = ca["transformer_layer_config"], cb["transformer_layer_config"]
    for key in ("hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "head_dim", "num_hidden_layers", "vocab_size",
                "max_position_embeddings", "rms_norm_eps", "hidden_act", "attention_bias",
                "mlp_bias", "rope_parameters"):
        assert la[key] == lb[key], key
    # the doctor's reading of both configs: equal but for the class name, the dtype (above)
    # and eagle3lab's provenance record
    sa, sb = (parse_draft_config(c).summary() for c in (ca, cb))
    differ = {k for k in sa.keys() | sb.keys() if sa.get(k) != sb.get(k)}
    assert differ == {"architectures", "dtype", "record", "record_source"}, differ
    assert (sa["architectures"], sb["architectures"]) == (["Eagle3DraftModel"],
                                                          ["Eagle3Speculator"])
    ra, rb = (inspect_checkpoint(p, target=fx["target"], engine="vllm") for p in (ours, theirs))
    assert ra.ok and rb.ok and ra.codes == ["aux-layers"]
    assert rb.codes == ["aux-layers", "dtype"]  # the doctor flags speculators' float32 copy


def test_speculators_epoch_checkpoints(foreign, fx, capsys):
    """An epoch dir is a drafter as it is (bf16, its optimizer state beside it ignored);
    the save_path means its checkpoint_best epoch, for inspect and convert alike."""
    save = foreign["save"]
    eps = speculators_epochs(save)
    assert [(c.epoch, c.step, c.best, c.latest) for c in eps] == [(0, 5, False, False),
                                                                  (1, 10, True, True)]
    assert sorted(p.name for p in (save / "1").iterdir()) == [
        "config.json", "config.py", "model.safetensors", "optimizer_state_dict.pt",
        "scheduler_state_dict.pt", "training_state.json", "val_metrics.json"]
    assert locate_checkpoint(save) == save / "1"
    r = inspect_checkpoint(save / "0", target=fx["target"])
    assert r.format == "speculators" and r.ok and r.checkpoint.endswith("/0")
    assert cli(["inspect", str(save), "--target", str(fx["target"]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint"] == str(save / "1")
    out = convert_checkpoint(save, save.parent / "from-epoch", to="sglang",
                             target=fx["target"]).path
    got = load_file(str(out / "model.safetensors"))
    want = load_file(str(save / "1" / "model.safetensors"))
    assert torch.equal(got["midlayer.mlp.up_proj.weight"], want["layers.0.mlp.up_proj.weight"])


def test_specforge_step_checkpoints_are_refused_with_the_export_command(foreign, tmp_path,
                                                                        capsys):
    """A {run_id}-step{N}/ dir is a pickled training state: refused (never unpickled) with
    the `specforge export` command, by the doctor, convert and accept alike."""
    out = tmp_path / "sf-out"
    step = step_checkpoint(out, "run1", 20, foreign["state"], latest=True)
    for path in (step, out):
        with pytest.raises(UserError, match="specforge export --to sglang"):
            locate_checkpoint(path)
    assert cli(["inspect", str(step)]) == 1
    assert "not a drafter directory" in capsys.readouterr().err
    with pytest.raises(UserError, match="SpecForge training checkpoint"):
        convert_checkpoint(step, tmp_path / "x", to="speculators")


#: The SGLang-servable shipped drafter (no norms, as SpecForge's format holds them): trained,
#: so it is accepted (measured on the prompt below: tau 2.29; 1.45 through a loader that
#: leaves its decoder layer at fresh initialisation). The default drafter is normed
#: (norm_before_fc, norm_before_residual, norm_output), which a SpecForge export drops.
SHIPPED = (Path(__file__).resolve().parents[2] / "data" / "drafters"
           / "smollm2-135m-instruct-sglang")


@pytest.mark.real
def test_accept_runs_on_exports_and_epochs(default_target_dir, real_target, tmp_path):
    """Offline acceptance takes a SpecForge export and a speculators save_path directly;
    the shipped drafter's weights give the same accept length either way, and the same as
    the shipped drafter itself. A drafter that is accepted (tau well above 1) first: an
    untrained one gives ~1.0 through any loader, even one that drops the decoder layer."""
    from safetensors.torch import save_file

    from eagle3lab.formats.targetinfo import target_tensor
    from eagle3lab.specdec.accept import Arm, measure_acceptance

    spec = tmp_path / "spec"  # shipped without embedding; an epoch of its run holds one
    spec.mkdir()
    # speculators' from_pretrained reads the verifier's weights from the path its config
    # records: the shipped one names the machine it was trained on, so point it here
    cfg = json.loads((SHIPPED / "config.json").read_text())
    cfg["speculators_config"]["verifier"]["name_or_path"] = str(default_target_dir)
    (spec / "config.json").write_text(json.dumps(cfg, indent=2))
    state = load_file(str(SHIPPED / "model.safetensors"))
    state["embed_tokens.weight"] = target_tensor(default_target_dir, "embed").contiguous()
    save_file(state, str(spec / "model.safetensors"))
    save = save_speculators_epochs(spec, tmp_path / "save", epochs=1, best=0)
    sf = export(draft_state_from_speculators(save / "0"), tmp_path / "sf",
                target_dir=default_target_dir)
    r = measure_acceptance(target=real_target, limit=1, max_new_tokens=16, steps=3,
                           arms=[Arm("shipped", str(SHIPPED)), Arm("specforge", str(sf)),
                                 Arm("speculators", str(save))], progress=False)
    taus = {a["name"]: a["stats"]["tau"] for a in r["arms"]}
    assert taus["shipped"] > 1.5, taus  # accepted: the equality below can fail
    assert taus["specforge"] == taus["speculators"] == taus["shipped"], taus
    assert all(a["matches_plain"] == 1 for a in r["arms"]), "exact greedy output"
