"""The shipped prompt set and prompt-file validation."""

import json

import pytest

from eagle3lab.errors import UserError
from eagle3lab.data.prompts import load_prompts, read_conversations


def test_shipped_prompts_are_many_diverse_and_split():
    train, ev = load_prompts("train"), load_prompts("eval")
    assert len(train) + len(ev) >= 600
    assert len(ev) >= 90
    assert not {p.prompt for p in train} & {p.prompt for p in ev}, "eval must be held out"
    assert not {p.id for p in train} & {p.id for p in ev}
    cats = {"coding", "math", "writing", "explanation", "chat", "reasoning"}
    assert {p.category for p in train} == cats and {p.category for p in ev} == cats
    assert {p.length for p in train} == {"short", "long"}


@pytest.mark.parametrize("content,msg", [
    ('{"prompt": "a"}\nnot json\n', "line 2: not valid JSON"),
    ('{"prompt": "a"}\n[1, 2]\n', "line 2: expected a JSON object"),
    ('{"id": "x", "prompt": ""}\n', "line 1: field 'prompt' is missing or empty"),
    ('{"id": "x", "prompt": "a"}\n{"id": "x", "prompt": "b"}\n', "line 2: id 'x' repeats"),
])
def test_bad_prompt_files_name_the_line(tmp_path, content, msg):
    p = tmp_path / "p.jsonl"
    p.write_text(content)
    with pytest.raises(UserError, match=msg):
        load_prompts(p)


def test_missing_prompts_file(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_prompts(tmp_path / "nope.jsonl")


def test_limit_and_default_ids(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(5)))
    got = load_prompts(p, limit=3)
    assert [x.id for x in got] == ["p-1", "p-2", "p-3"]


# ---------------------------------------------------------------------------------------
# concat_jsonl: the training conversations of bench/gpu_pipeline.py from several parts
# ---------------------------------------------------------------------------------------
def test_concat_jsonl_joins_parts_and_rewrites_only_on_change(tmp_path, tiny_target):
    import os

    from eagle3lab.data.prompts import concat_jsonl, read_conversations
    from testutil import write_conversations

    a = write_conversations(tmp_path / "a.jsonl", tiny_target.tokenizer, n=3, seed=0)
    b = write_conversations(tmp_path / "b.jsonl", tiny_target.tokenizer, n=2, seed=1)
    dst = tmp_path / "responses" / "train.jsonl"
    r = concat_jsonl([a, b], dst)
    assert r == {"out": str(dst), "records": 5, "rewritten": True, "parts": [str(a), str(b)],
                 "meta": str(dst) + ".meta.json", "rendering": r["rendering"]}
    got = read_conversations(dst)
    assert got == read_conversations(a) + read_conversations(b)  # in order, whole records

    mtime = dst.stat().st_mtime_ns
    os.utime(dst, ns=(mtime - 10**9, mtime - 10**9))
    again = concat_jsonl([a, b], dst)  # a resumed run: the same data, left untouched
    assert again["rewritten"] is False and again["records"] == 5
    assert dst.stat().st_mtime_ns == mtime - 10**9
    assert concat_jsonl([b], dst)["rewritten"] is True  # the mix changed: rewritten
    assert read_conversations(dst) == read_conversations(b)


def test_concat_jsonl_ends_every_part_with_a_newline(tmp_path):
    from eagle3lab.data.prompts import concat_jsonl

    (tmp_path / "a.jsonl").write_text('{"id": 1}')  # no newline after the last record
    (tmp_path / "b.jsonl").write_text('{"id": 2}\n')
    r = concat_jsonl([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], tmp_path / "out.jsonl")
    assert r["records"] == 2
    assert [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()] == [
        {"id": 1}, {"id": 2}]


def test_concat_jsonl_names_a_missing_part(tmp_path):
    from eagle3lab.data.prompts import concat_jsonl

    (tmp_path / "a.jsonl").write_text('{"id": 1}\n')
    with pytest.raises(UserError, match=r"missing part\(s\) .*nope\.jsonl"):
        concat_jsonl([tmp_path / "a.jsonl", tmp_path / "nope.jsonl"], tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def _regenerated(tmp_path, target, name, **kw):
    """A real part: `regenerate` of two prompts of its own (ids distinct per part)."""
    from eagle3lab.data.regenerate import regenerate

    prompts = tmp_path / f"{name}-prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"{name}{i}", "prompt": t}) + "\n"
                               for i, t in enumerate(["Say hello.", "Name a colour."])))
    out = tmp_path / f"{name}.jsonl"
    regenerate(target=target, prompts=prompts, out=out, max_new_tokens=3, batch_size=2,
               progress=False, **kw)
    return out


def test_concat_jsonl_keeps_the_parts_common_rendering(tmp_path, tiny_target):
    """Parts regenerated alike: the meta carries their record (what extract and online
    training read back as the data's rendering), each part with its sha256, and the
    target that answered them."""
    from eagle3lab.data.prompts import concat_jsonl
    from eagle3lab.data.regenerate import conversations_rendering, meta_path
    from eagle3lab.data.rendering import Renderer, is_unknown
    from eagle3lab.fsutil import sha256_file

    a = _regenerated(tmp_path, tiny_target, "a")
    b = _regenerated(tmp_path, tiny_target, "b")
    dst = tmp_path / "train.jsonl"
    r = concat_jsonl([a, b], dst)
    part_meta = json.loads(meta_path(a).read_text())
    assert not is_unknown(r["rendering"])
    assert r["rendering"] == part_meta["rendering"] == Renderer(tiny_target.tokenizer).record()
    assert conversations_rendering(dst) == r["rendering"]  # what extract records
    meta = json.loads(meta_path(dst).read_text())
    assert meta["kind"] == "eagle3lab-conversations" and meta["records"] == 4
    assert [(p["path"], p["sha256"], p["records"]) for p in meta["concat"]] == [
        (str(a), sha256_file(a), 2), (str(b), sha256_file(b), 2)]
    assert meta["target"]["config_sha256"] == tiny_target.config_sha256
    # online training's target check reads the concatenated file's meta like a part's
    from eagle3lab.train.online import check_conversations_target

    check_conversations_target(dst, tiny_target)


def test_concat_jsonl_of_differing_renderings_is_unknown(tmp_path, tiny_target):
    from eagle3lab.data.prompts import concat_jsonl
    from eagle3lab.data.regenerate import conversations_rendering, meta_path
    from eagle3lab.data.rendering import is_unknown

    a = _regenerated(tmp_path, tiny_target, "a")
    b = _regenerated(tmp_path, tiny_target, "b", system_prompt="")  # an empty system block
    dst = tmp_path / "train.jsonl"
    r = concat_jsonl([a, b], dst)
    assert is_unknown(r["rendering"]) and is_unknown(conversations_rendering(dst))
    assert "rendered differently" in r["rendering"]["why"]
    why = r["rendering"]["why"]
    assert "a.jsonl: " in why and "system prompt: empty" in why
    parts = json.loads(meta_path(dst).read_text())["concat"]
    assert [p["rendering"]["system_prompt"] for p in parts] == [None, ""]  # each part's own
    # the same parts in one rendering again: the meta says so (rewritten with the data)
    c = _regenerated(tmp_path, tiny_target, "c")
    assert not is_unknown(concat_jsonl([a, c], dst)["rendering"])
    assert not is_unknown(conversations_rendering(dst))


def test_concat_jsonl_with_a_part_without_meta_is_unknown(tmp_path, tiny_target):
    from eagle3lab.data.prompts import concat_jsonl
    from eagle3lab.data.regenerate import meta_path
    from eagle3lab.data.rendering import is_unknown
    from testutil import write_conversations

    a = _regenerated(tmp_path, tiny_target, "a")
    b = write_conversations(tmp_path / "b.jsonl", tiny_target.tokenizer, n=2)  # no meta
    r = concat_jsonl([a, b], tmp_path / "train.jsonl")
    assert is_unknown(r["rendering"])
    assert r["rendering"]["why"] == ("concatenated from parts of which b.jsonl records no "
                                     "rendering")
    meta = json.loads(meta_path(tmp_path / "train.jsonl").read_text())
    assert "target" not in meta  # b names no target: none is claimed for the mix
    assert meta["concat"][1]["rendering"]["why"].startswith("b.jsonl has no b.jsonl.meta.json")


@pytest.mark.parametrize("limit", [0, -1, 2.5, True])
def test_a_limit_below_one_is_refused(limit):
    with pytest.raises(UserError, match=r"limit \(--limit\) must be a whole number of at least"):
        load_prompts("eval", limit=limit)


def _conv(ids, mask):
    return json.dumps({"id": "c", "input_ids": ids, "loss_mask": mask}) + "\n"


@pytest.mark.parametrize("record,msg", [
    (_conv([1, "5", 2], [0, 1, 1]), 'line 2: input_ids\\[1\\] is "5", expected a token id'),
    (_conv([1, 2.0], [0, 1]), r"line 2: input_ids\[1\] is 2.0"),
    (_conv([1, True], [0, 1]), r"line 2: input_ids\[1\] is true"),
    (_conv([1, -3], [0, 1]), r"line 2: input_ids\[1\] is -3"),
    (_conv([1, 2], [0, 2]), r"line 2: loss_mask\[1\] is 2, expected 0 or 1"),
    ("[1, 2]\n", "line 2: expected a JSON object"),
])
def test_bad_conversation_records_name_the_line_and_item(tmp_path, record, msg):
    p = tmp_path / "c.jsonl"
    p.write_text(_conv([1, 2], [0, 1]) + record)
    with pytest.raises(UserError, match=msg):
        read_conversations(p)


def test_a_non_utf8_conversations_file_names_the_line(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_bytes(_conv([1, 2], [0, 1]).encode() + b"\n\xc3\x28\n")
    with pytest.raises(UserError, match=r"c.jsonl, line 3: not UTF-8 text \(byte 0xc3"):
        read_conversations(p)


def test_jsonl_lines_end_at_newline_only(tmp_path):
    """A JSON string may hold U+2028, U+0085 or a form feed (json.dumps with
    ensure_ascii=False writes them raw): str.splitlines would cut the record there (seen on
    90,000 self-written prompts, where a regenerate run refused line 41,461)."""
    p = tmp_path / "p.jsonl"
    texts = ["a\u2028b", "c\x85d", "e\x0cf", "plain"]
    p.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}, ensure_ascii=False) + "\n"
                         for i, t in enumerate(texts)).replace("\n", "\r\n", 1),
                 encoding="utf-8")
    assert [x.prompt for x in load_prompts(str(p))] == texts
