"""Packing conversations as token ids for carrying (eagle3lab.data.tokpack): a regenerate
output (sampled records with their seeds, several samples per prompt, one whose text is
not its ids' decode; greedy ones in tests/test_bench_tokpack.py) and its meta come back
byte for byte from parts that each fit the size limit, and a re-run of the same
regenerate on the unpacked file has nothing left to do; a prompts file travels as bytes;
a missing, corrupt or foreign part is refused in one line naming it; ids that do not fit
uint16 are refused."""

import json

import pytest

from eagle3lab.data.regenerate import meta_path, regenerate
from eagle3lab.data.tokpack import find_parts, pack, unpack
from eagle3lab.errors import UserError


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory, tiny_target):
    d = tmp_path_factory.mktemp("regen")
    prompts = d / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Say {i} things, "
                                           f"please. Ünïcode ✓ {i}"}) + "\n"
                               for i in range(24)))
    out = d / "r.jsonl"
    kw = dict(target=tiny_target, prompts=prompts, out=out, max_new_tokens=40,
              batch_size=8, temperature=1.0, seed=3, progress=False)  # little to compress
    regenerate(**kw)
    return d, prompts, out, kw


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_round_trip_is_byte_identical_and_resumable(regenerated, tiny_target, tmp_path):
    d, prompts, out, kw = regenerated
    one = pack(out, tmp_path / "one", target=tiny_target)
    assert one["mode"] == "tokens" and one["records"] == 24 and len(one["parts"]) == 1
    assert one["packed_bytes"] < out.stat().st_size / 3
    s = pack(out, tmp_path / "parts", max_bytes=2500, target=tiny_target)
    assert len(s["parts"]) >= 3 and all(p["bytes"] <= 2500 for p in s["parts"])
    assert sum(p["records"] for p in s["parts"]) == 24
    back = tmp_path / "back" / "r.jsonl"
    u = unpack(tmp_path / "parts", back, target=tiny_target)
    assert u["records"] == 24 and u["parts"] == len(s["parts"])
    assert back.read_bytes() == out.read_bytes()
    assert meta_path(back).read_bytes() == meta_path(out).read_bytes()
    # the other side resumes the file it wrote: nothing is answered twice
    r = regenerate(**{**kw, "out": back, "limit": 16})
    assert r["new_records"] == 0 and back.read_bytes() == out.read_bytes()


def test_several_samples_and_a_text_that_is_not_its_decode(regenerated, tiny_target,
                                                           tmp_path):
    d, prompts, out, kw = regenerated
    sampled = tmp_path / "s.jsonl"
    regenerate(**{**kw, "out": sampled, "seed": 5, "samples": 2, "limit": 3})
    lines = sampled.read_text(encoding="utf-8").splitlines(keepends=True)
    rec = json.loads(lines[1])
    rec["response"] = "edited by hand ✓"
    lines[1] = json.dumps(rec, ensure_ascii=False) + "\n"
    sampled.write_text("".join(lines), encoding="utf-8")
    s = pack(sampled, tmp_path / "parts", target=tiny_target)
    assert s["mode"] == "tokens" and len(s["parts"]) == 1
    unpack(find_parts(tmp_path / "parts"), tmp_path / "b.jsonl", target=tiny_target)
    assert (tmp_path / "b.jsonl").read_bytes() == sampled.read_bytes()


def test_prompts_file_travels_as_bytes(regenerated, tmp_path):
    d, prompts, out, kw = regenerated
    meta_path(prompts).write_text('{"kind": "eagle3lab-prompts"}\n')
    s = pack(prompts, tmp_path / "p", max_bytes=2500)
    assert s["mode"] == "bytes" and "not a conversation record" in s["why_bytes"]
    unpack(tmp_path / "p", tmp_path / "prompts.jsonl")
    assert (tmp_path / "prompts.jsonl").read_bytes() == prompts.read_bytes()
    assert meta_path(tmp_path / "prompts.jsonl").read_bytes() == meta_path(prompts).read_bytes()
    with pytest.raises(UserError, match="pack it with mode bytes"):
        pack(prompts, tmp_path / "q", mode="tokens")


def test_missing_corrupt_or_foreign_parts_are_named(regenerated, tiny_target, tmp_path):
    d, prompts, out, kw = regenerated
    parts = pack(out, tmp_path / "parts", max_bytes=2500, target=tiny_target)["parts"]
    names = [p["path"] for p in parts]
    assert len(names) >= 3
    dst = tmp_path / "x.jsonl"
    with pytest.raises(UserError) as e:  # a middle part left behind
        unpack([names[0]] + names[2:], dst, target=tiny_target)
    assert f"missing part(s) of r before {names[2].split('/')[-1]}" in _one_line(e)
    with pytest.raises(UserError) as e:  # the last one
        unpack(names[:-1], dst, target=tiny_target)
    assert "missing part(s) of r after r.part" in _one_line(e) and "of 24" in str(e.value)
    data = bytearray(open(names[1], "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(names[1], "wb").write(bytes(data))
    with pytest.raises(UserError) as e:
        unpack(tmp_path / "parts", dst, target=tiny_target)
    assert _one_line(e).startswith(f"{names[1]}: unreadable part")
    assert not dst.exists() and not meta_path(dst).exists()
    other = tmp_path / "other.jsonl"
    other.write_bytes(out.read_bytes()[: out.read_bytes().index(b"\n") + 1])
    pack(other, tmp_path / "o", target=tiny_target, name="r")
    with pytest.raises(UserError) as e:
        unpack([names[0], str(tmp_path / "o" / "r.part01.npz")], dst, target=tiny_target)
    assert "is a part of another file" in _one_line(e)


class OtherTokenizer:
    """Decodes every answer to other text than the packing tokenizer did."""
    name_or_path = "other"

    def decode(self, ids, skip_special_tokens=False):
        return f"{len(ids)} tokens"

    def convert_ids_to_tokens(self, ids):
        return [str(i) for i in ids]


def test_another_tokenizer_is_refused(regenerated, tiny_target, tmp_path):
    d, prompts, out, kw = regenerated
    pack(out, tmp_path / "parts", target=tiny_target)
    with pytest.raises(UserError) as e:
        unpack(tmp_path / "parts", tmp_path / "x.jsonl", target=OtherTokenizer())
    assert "do not rebuild to the packed bytes" in _one_line(e)
    assert "the tokenizer (other) is not the one r.jsonl was packed with" in str(e.value)
    assert not (tmp_path / "x.jsonl").exists()


def test_ids_that_do_not_fit_uint16_are_refused(regenerated, tmp_path):
    d, prompts, out, kw = regenerated
    rec = json.loads(out.read_text(encoding="utf-8").splitlines()[0])
    rec["input_ids"][-1] = 70000
    big = tmp_path / "big.jsonl"
    big.write_text(json.dumps(rec) + "\n")
    with pytest.raises(UserError) as e:
        pack(big, tmp_path / "p")
    assert _one_line(e).startswith(f"{big}, line 1: token id 70000 does not fit uint16")
