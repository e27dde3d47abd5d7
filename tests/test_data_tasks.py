"""compute.data for the tasks beyond classification (issue 17): regression, masked-token (mask in the text, a word
index, BLiMP pairs, the Linzen agreement file), next-token and qa; their errors; the bundled example files."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from compute.data import Dataset, Record, load_dataset
from compute.errors import AttrscopeError, UsageError

TASKS_DIR = Path(__file__).resolve().parents[1] / "examples" / "tasks"
M = "[MASK]"


from test_data import write, write_jsonl  # noqa: E402  (the data tests' file writers)


def load_error(spec, **kwargs) -> str:
    """The message of the AttrscopeError that load_dataset raises; it must be one line."""
    with pytest.raises(AttrscopeError) as info:
        load_dataset(spec, **kwargs)
    assert type(info.value) is AttrscopeError  # a data problem, not a usage error
    message = str(info.value)
    assert message and "\n" not in message, message
    return message


def usage_error(spec, **kwargs) -> str:
    with pytest.raises(UsageError) as info:
        load_dataset(spec, **kwargs)
    message = str(info.value)
    assert message and "\n" not in message, message
    return message


def lm(row, id_, text, target=None, foil=None, evidence=None, pair=None) -> Record:
    return Record(row=row, id=id_, text=text, pair=pair, label=-1, evidence=evidence, target=target, foil=foil)


# --- classification stays as it was ------------------------------------------------------------------------


def test_classification_records_have_the_new_fields_at_their_defaults(tmp_path):
    spec = write_jsonl(tmp_path / "d.jsonl", [{"text": "good", "label": 1, "target": "x"}])
    ds = load_dataset(spec, task="classification")
    assert ds == load_dataset(spec)
    # "target" is still a label candidate for classification, but "label" comes first.
    assert ds.columns == {"text": "text", "pair": None, "label": "label", "id": None}
    assert ds.records == [Record(0, "0", "good", None, 1, None, None, None, None, None)]
    assert (ds.task, ds.skipped, ds.notes) == ("classification", 0, ())


# --- regression -------------------------------------------------------------------------------------------------


def test_regression_pairs_with_float_labels(tmp_path):
    spec = write_jsonl(tmp_path / "r.jsonl", [
        {"idx": 7, "sentence1": "a cat", "sentence2": "a kitten", "label": 4.25},
        {"idx": 8, "sentence1": "rain", "sentence2": "sun", "label": 0},
        {"idx": 9, "sentence1": "x", "sentence2": "y", "label": None},
        {"idx": 10, "sentence1": "p", "sentence2": "q", "label": float("nan")},
    ])
    ds = load_dataset(spec, task="regression", label2id={"LABEL_0": 0}, num_labels=1)
    assert ds.records == [
        Record(0, "7", "a cat", "a kitten", -1, value=4.25),
        Record(1, "8", "rain", "sun", -1, value=0.0),
        Record(2, "9", "x", "y", -1, value=None),
        Record(3, "10", "p", "q", -1, value=None),
    ]
    assert ds.columns == {"text": "sentence1", "pair": "sentence2", "label": "label", "id": "idx", "format": "plain"}
    assert (ds.task, ds.skipped, ds.notes, ds.label_names, ds.kind, ds.n_rows) == ("regression", 0, (), None,
                                                                                  "jsonl", 4)


def test_regression_label_strings_in_csv_and_the_score_column(tmp_path):
    spec = write(tmp_path / "r.csv", "sentence,score,target\nfine, 3.5 ,x\nok,,y\nbad,-1e-1,z\nnan,nan,w\n")
    ds = load_dataset(spec, task="regression")
    assert ds.columns["label"] == "score"  # "target" is not a regression label candidate
    assert ds.records == [Record(0, "0", "fine", None, -1, value=3.5), Record(1, "1", "ok", None, -1, value=None),
                          Record(2, "2", "bad", None, -1, value=-0.1), Record(3, "3", "nan", None, -1, value=None)]
    assert load_dataset(spec, task="regression", label_column="score").records == ds.records


def test_regression_without_a_label_column_is_unlabelled(tmp_path):
    spec = write_jsonl(tmp_path / "r.jsonl", [{"text": "a"}])
    assert load_dataset(spec, task="regression").records == [Record(0, "0", "a", None, -1)]


@pytest.mark.parametrize("cell, shown", [("high", "'high'"), ("inf", "'inf'"), (True, "True"), ([1], "[1]")])
def test_regression_non_numeric_label(tmp_path, cell, shown):
    spec = write_jsonl(tmp_path / "r.jsonl", [{"text": "a", "label": 1}, {"text": "b", "label": cell}])
    message = load_error(spec, task="regression")
    assert message.startswith(f"label {shown} in row 1 of '{spec}' (line 2) is not a number")
    assert "--label-column" in message


# --- masked-token: a mask token in the text ---------------------------------------------------------------------


def test_masked_token_text_with_target_and_foil(tmp_path):
    spec = write_jsonl(tmp_path / "m.jsonl", [
        {"id": "a", "text": "The keys [MASK] here.", "target": "are", "foil": "is"},
        {"id": "b", "text": "[MASK] dogs bark.", "target": "The"},
        {"id": "c", "text": "It  [MASK] . ", "target": "", "foil": None},
        {"id": "d", "text": "No target [MASK]", "foil": "x"},
    ])
    ds = load_dataset(spec, task="masked-token", mask_token=M)
    assert ds.records == [lm(0, "a", "The keys [MASK] here.", "are", "is"), lm(1, "b", "[MASK] dogs bark.", "The"),
                          lm(2, "c", "It  [MASK] . "), lm(3, "d", "No target [MASK]", None, "x")]
    assert ds.columns == {"text": "text", "pair": None, "label": None, "id": "id", "target": "target",
                          "foil": "foil", "format": "plain"}
    assert (ds.task, ds.skipped, ds.notes, ds.label_names) == ("masked-token", 0, (), None)


def test_masked_token_flags_override_and_roberta_mask(tmp_path):
    spec = write(tmp_path / "m.tsv", "s\tgood\tbad\tnote\nA <mask> day.\tsunny\trainy\tn\n")
    ds = load_dataset(spec, task="masked-token", mask_token="<mask>", text_column="s", target_column="good",
                      foil_column="bad", pair_column="note")
    assert ds.records == [lm(0, "0", "A <mask> day.", "sunny", "rainy", pair="n")]
    assert ds.columns == {"text": "s", "pair": "note", "label": None, "id": None, "target": "good", "foil": "bad",
                          "format": "plain"}


def test_masked_token_evidence_column(tmp_path):
    spec = write_jsonl(tmp_path / "m.jsonl", [{"text": "Dogs [MASK].", "ev": [[0, 4]]}])
    ds = load_dataset(spec, task="masked-token", mask_token=M, evidence_column="ev")
    assert ds.records == [lm(0, "0", "Dogs [MASK].", evidence=((0, 0, 4),))]
    assert ds.columns["evidence"] == "ev"


def test_masked_token_without_a_mask(tmp_path):
    spec = write_jsonl(tmp_path / "m.jsonl", [{"text": "one [MASK]"}, {"text": "no mask here"}])
    assert load_error(spec, task="masked-token", mask_token=M) == (
        f"row 1 of '{spec}' (line 2) has no mask token '[MASK]' in column 'text': write '[MASK]' where the word to "
        "predict is, or pass --word-index-column")


def test_masked_token_with_another_models_mask(tmp_path):
    spec = write_jsonl(tmp_path / "m.jsonl", [{"text": "a [MASK] b"}])
    assert load_error(spec, task="masked-token", mask_token="<mask>") == (
        f"row 0 of '{spec}' (line 1) has no mask token '<mask>' in column 'text': it holds '[MASK]', but this "
        "model's mask token is '<mask>': write '<mask>' instead")


def test_masked_token_with_two_masks(tmp_path):
    spec = write_jsonl(tmp_path / "m.jsonl", [{"text": "[MASK] and [MASK]"}])
    assert load_error(spec, task="masked-token", mask_token=M) == (
        f"row 0 of '{spec}' (line 1) holds the mask token '[MASK]' 2 times in column 'text': masked-token explains "
        "one masked word, so keep one")


def test_target_equal_to_foil(tmp_path):
    spec = write_jsonl(tmp_path / "m.jsonl", [{"text": "a [MASK]", "target": "is", "foil": "is"}])
    assert load_error(spec, task="masked-token", mask_token=M) == (
        f"row 0 of '{spec}' (line 1): the target and the foil are both 'is': a foil must differ from the target "
        "(or leave the foil empty)")


def test_target_that_is_not_text(tmp_path):
    spec = write_jsonl(tmp_path / "m.jsonl", [{"text": "a [MASK]", "target": 3}])
    assert load_error(spec, task="masked-token", mask_token=M) == (
        f"row 0 of '{spec}' (line 1) has 3 in the target column 'target', not a word: write the target word as "
        "text")


def test_no_text_column_for_masked_token(tmp_path):
    spec = write_jsonl(tmp_path / "m.jsonl", [{"words": "a [MASK]"}])
    assert load_error(spec, task="masked-token", mask_token=M) == (
        f"no text column found in '{spec}' (columns: 'words'): pass --text-column")


# --- masked-token: a word index ---------------------------------------------------------------------------------


def test_word_index_masks_the_word_and_keeps_punctuation_and_spacing(tmp_path):
    spec = write_jsonl(tmp_path / "w.jsonl", [
        {"text": "The  dogs bark.", "word_index": 2},  # the word becomes the target
        {"text": "(Cats) sleep", "word_index": "0", "target": "cats", "foil": "cat"},  # case-insensitive check
        {"text": "It is", "word_index": 1.0, "target": "are", "foil": "is"},  # the text may hold the foil
        {"text": "Yes ...", "word_index": 1},  # a word of punctuation only is masked whole
    ])
    ds = load_dataset(spec, task="masked-token", mask_token=M)
    assert ds.records == [lm(0, "0", "The  dogs [MASK].", "bark"), lm(1, "1", "([MASK]) sleep", "cats", "cat"),
                          lm(2, "2", "It [MASK]", "are", "is"), lm(3, "3", "Yes [MASK]", "...")]
    assert ds.columns == {"text": "text", "pair": None, "label": None, "id": None, "target": "target",
                          "foil": "foil", "format": "plain", "word_index": "word_index"}


def test_explicit_word_index_column_and_evidence_moved_to_the_masked_text(tmp_path):
    spec = write_jsonl(tmp_path / "w.jsonl", [{"text": "The keys to it are here", "pos": 4, "ev": [[4, 8], [19, 23]]}])
    ds = load_dataset(spec, task="masked-token", mask_token=M, word_index_column="pos", evidence_column="ev")
    # "are" (3 characters) became "[MASK]" (6): spans after it move by 3.
    assert ds.records == [lm(0, "0", "The keys to it [MASK] here", "are", evidence=((0, 4, 8), (0, 22, 26)))]


def test_evidence_on_the_masked_word(tmp_path):
    spec = write_jsonl(tmp_path / "w.jsonl", [{"text": "The keys are here", "word_index": 2, "ev": [[9, 12]]}])
    assert load_error(spec, task="masked-token", mask_token=M, evidence_column="ev") == (
        f"row 0 of '{spec}' (line 1): the evidence span [9, 12) overlaps the masked word: evidence must point at "
        "other words")


@pytest.mark.parametrize("index", [3, -1])
def test_word_index_out_of_range(tmp_path, index):
    spec = write_jsonl(tmp_path / "w.jsonl", [{"text": "a b c", "word_index": index}])
    assert load_error(spec, task="masked-token", mask_token=M) == (
        f"word index {index} in row 0 of '{spec}' (line 1) (column 'word_index') is out of range: the text has 3 "
        "words, 0..2 counting from 0")


@pytest.mark.parametrize("index", ["two", 1.5, None, True])
def test_word_index_not_a_whole_number(tmp_path, index):
    spec = write_jsonl(tmp_path / "w.jsonl", [{"text": "a b c", "word_index": index}])
    assert load_error(spec, task="masked-token", mask_token=M).startswith(
        f"row 0 of '{spec}' (line 1) has {index!r} in the word index column 'word_index', not a whole number")


def test_word_index_pointing_at_neither_target_nor_foil(tmp_path):
    spec = write(tmp_path / "a.tsv", "sentence\tverb_index\tcorrect\twrong\nthe dogs bark\t1\tbark\tbarks\n")
    assert load_error(spec, task="masked-token", mask_token=M) == (
        f"row 0 of '{spec}' (line 2): word 1 ('verb_index', counting from 0) is 'dogs', neither the target 'bark' "
        "nor the foil 'barks': check the index counts whitespace-separated words from 0")


def test_word_index_and_a_mask_in_the_text(tmp_path):
    spec = write_jsonl(tmp_path / "w.jsonl", [{"text": "a [MASK] c", "word_index": 0}])
    assert load_error(spec, task="masked-token", mask_token=M) == (
        f"row 0 of '{spec}' (line 1) already holds the mask token '[MASK]' and a word index in 'word_index': keep "
        "one of the two")


# --- masked-token: the agreement files ----------------------------------------------------------------------


def test_bundled_simple_agreement_file():
    spec = str(TASKS_DIR / "agreement.tsv")
    ds = load_dataset(spec, task="masked-token", mask_token=M)
    assert ds.columns == {"text": "sentence", "pair": None, "label": None, "id": None, "target": "correct",
                          "foil": "wrong", "format": "plain", "word_index": "verb_index"}
    assert len(ds.records) == ds.n_rows == 12 and (ds.skipped, ds.notes) == (0, ())
    assert ds.records[0] == lm(0, "0", "the keys to the old cabinet [MASK] on the table .", "are", "is")
    assert ds.records[2] == lm(2, "2", "the dogs that the boy feeds [MASK] at night .", "bark", "barks")
    lines = (TASKS_DIR / "agreement.tsv").read_text().splitlines()[1:]
    for record, line in zip(ds.records, lines):
        sentence, index, correct, wrong = line.split("\t")
        words = sentence.split()
        words[int(index)] = M
        assert record == lm(record.row, str(record.row), " ".join(words), correct, wrong)


LINZEN_HEADER = ("sentence\torig_sentence\tpos_sentence\tsubj\tverb\tsubj_pos\thas_rel\thas_nsubj\tverb_pos\t"
                 "subj_index\tverb_index\tn_intervening\tlast_intervening\tn_diff_intervening\tdistance\tmax_depth\t"
                 "all_nouns\tnouns_up_to_verb")


def linzen_row(orig: str, subj: str, verb: str, subj_index: int, verb_index: int, foil: str | None = None) -> str:
    cells = [orig, orig, "DT NNS VBP", subj, verb, "NNS", "False", "False", "VBP", str(subj_index), str(verb_index),
             "0", "na", "0", str(verb_index - subj_index), "0", subj, subj]
    return "\t".join(cells + ([foil] if foil is not None else []))


def test_bundled_linzen_file():
    spec = str(TASKS_DIR / "agreement_linzen.tsv")
    ds = load_dataset(spec, task="masked-token", mask_token=M)
    assert ds.columns == {"text": "orig_sentence", "pair": None, "label": None, "id": None, "target": "verb",
                          "foil": None, "word_index": "verb_index", "subject_index": "subj_index",
                          "subject": "subj", "format": "linzen"}
    assert len(ds.records) == 12 and (ds.skipped, ds.notes) == (0, ())
    # The subject noun's span is the evidence; the `sentence` column (rare words as POS tags) is not read.
    assert ds.records[0] == lm(0, "0", "the keys to the cabinet [MASK] on a hook .", "hang", None, ((0, 4, 8),))
    assert ds.records[3] == lm(3, "3", "the painting above the beds [MASK] a harbour .", "shows", None,
                               ((0, 4, 12),))
    assert ds.records[9] == lm(9, "9", "the birds [MASK] every morning .", "sing", None, ((0, 4, 9),))
    for line, record in zip((TASKS_DIR / "agreement_linzen.tsv").read_text().splitlines()[1:], ds.records):
        cells = dict(zip(LINZEN_HEADER.split("\t"), line.split("\t")))
        words = cells["orig_sentence"].split()
        assert words[int(cells["verb_index"]) - 1] == record.target == cells["verb"]
        (_, start, end), = record.evidence
        assert record.text[start:end] == cells["subj"] == words[int(cells["subj_index"]) - 1]
        assert record.text.split()[int(cells["verb_index"]) - 1] == M


def test_bundled_linzen_file_for_next_token():
    spec = str(TASKS_DIR / "agreement_linzen.tsv")
    ds = load_dataset(spec, task="next-token")
    assert ds.columns["format"] == "linzen" and ds.task == "next-token" and len(ds.records) == 12
    assert ds.records[0] == lm(0, "0", "the keys to the cabinet", "hang", None, ((0, 4, 8),))
    assert ds.records[9] == lm(9, "9", "the birds", "sing", None, ((0, 4, 9),))
    masked = load_dataset(spec, task="masked-token", mask_token=M).records
    for prefix, record in zip(ds.records, masked):
        assert record.text.startswith(prefix.text + " " + M)
        assert (prefix.target, prefix.foil, prefix.evidence) == (record.target, record.foil, record.evidence)


def test_linzen_next_token_needs_words_before_the_verb(tmp_path):
    spec = write(tmp_path / "l.tsv", LINZEN_HEADER + "\tev\n" + linzen_row("walk the men", "men", "walk", 3, 1)
                 + "\t\n")
    assert load_error(spec, task="next-token") == (
        f"row 0 of '{spec}' (line 2): the verb is the first word, so there is no prefix before it: next-token needs "
        "at least one word before the verb (remove the row)")
    spec = write(tmp_path / "m.tsv", LINZEN_HEADER + "\tev\n" + linzen_row("the men walk far", "men", "walk", 2, 3)
                 + "\t[[13, 16]]\n")
    assert load_error(spec, task="next-token", evidence_column="ev") == (
        f"row 0 of '{spec}' (line 2): an evidence span ends after the prefix (the words before the verb): evidence "
        "must point at words of the prefix")
    assert load_dataset(spec, task="next-token").records == [lm(0, "0", "the men", "walk", None, ((0, 4, 7),))]


def test_linzen_layout_with_a_foil_column(tmp_path):
    spec = write(tmp_path / "l.tsv", LINZEN_HEADER + "\tfoil\n" + linzen_row("the men walk", "men", "walk", 2, 3,
                                                                               "walks") + "\n")
    ds = load_dataset(spec, task="masked-token", mask_token=M)
    assert ds.records == [lm(0, "0", "the men [MASK]", "walk", "walks", ((0, 4, 7),))]
    assert ds.columns["foil"] == "foil" and ds.columns["format"] == "linzen"


def test_linzen_verb_index_counts_from_one(tmp_path):
    spec = write(tmp_path / "l.tsv", LINZEN_HEADER + "\n" + linzen_row("the men walk", "men", "walk", 2, 2) + "\n")
    assert load_error(spec, task="masked-token", mask_token=M) == (
        f"row 0 of '{spec}' (line 2): word 2 ('verb_index', counting from 1) is 'men', neither the target 'walk' "
        "nor the foil None: check the index counts whitespace-separated words from 1")


def test_linzen_subject_index_mismatch(tmp_path):
    spec = write(tmp_path / "l.tsv", LINZEN_HEADER + "\n" + linzen_row("the men walk", "men", "walk", 1, 3) + "\n")
    assert load_error(spec, task="masked-token", mask_token=M) == (
        f"row 0 of '{spec}' (line 2): word 1 ('subj_index') is 'the', not the subject 'men': check the row")


def test_linzen_layout_read_as_a_plain_word_index_with_the_flag(tmp_path):
    # --word-index-column turns the layout detection off: the index then counts from 0.
    spec = write(tmp_path / "l.tsv", LINZEN_HEADER + "\n" + linzen_row("the men walk", "men", "walk", 2, 2) + "\n")
    ds = load_dataset(spec, task="masked-token", mask_token=M, word_index_column="verb_index", target_column="verb")
    assert ds.records == [lm(0, "0", "the men [MASK]", "walk")]
    assert ds.columns["format"] == "plain" and ds.columns["text"] == "sentence"


# --- BLiMP ----------------------------------------------------------------------------------------------------------


def blimp(good: str, bad: str, pair_id: str, uid: str = "agr", **extra) -> dict:
    return {"sentence_good": good, "sentence_bad": bad, "UID": uid, "pairID": pair_id, "one_prefix_method": False,
            **extra}


def test_blimp_pairs_masked(tmp_path):
    spec = write_jsonl(tmp_path / "b.jsonl", [
        blimp("The cats are here.", "The cats is here.", "0"),
        blimp("Who did she see?", "Who did see she?", "1"),  # two words differ: skipped
        blimp("Dogs bark.", "Dogs are barking.", "2"),  # different lengths: skipped
        blimp("He hurt himself.", "He hurt herself!", "3"),  # the punctuation differs too: skipped
        blimp("These  books, sadly", "This  books, sadly", "4"),
        blimp("A bird sings.", "A bird sing.", "5"),
        blimp("It is 'fine'.", "It is 'finer'.", "6"),
        blimp("a b", "a c", "7"),
    ])
    ds = load_dataset(spec, task="masked-token", mask_token="<mask>")
    assert ds.records == [lm(0, "agr_0", "The cats <mask> here.", "are", "is"),
                          lm(4, "agr_4", "<mask>  books, sadly", "These", "This"),
                          lm(5, "agr_5", "A bird <mask>.", "sings", "sing"),
                          lm(6, "agr_6", "It is '<mask>'.", "fine", "finer"),
                          lm(7, "agr_7", "a <mask>", "b", "c")]
    assert (ds.task, ds.n_rows, ds.skipped) == ("masked-token", 8, 3)
    assert ds.notes == (f"skipped 3 of 8 BLiMP pairs in '{spec}' that do not differ in exactly one word (with the "
                        "same punctuation around it): rows 1, 2, 3",)
    assert ds.columns == {"text": "sentence_good", "pair": None, "label": None, "id": None, "format": "blimp",
                          "good": "sentence_good", "bad": "sentence_bad", "blimp_uid": "UID",
                          "blimp_pair_id": "pairID"}


def test_blimp_ids_without_uid_and_with_id_column(tmp_path):
    rows = [{"sentence_good": "a b", "sentence_bad": "a c", "pairID": "12", "n": "x"},
            {"sentence_good": "d e", "sentence_bad": "d f", "pairID": "13", "n": "y"}]
    spec = write_jsonl(tmp_path / "b.jsonl", rows)
    assert [r.id for r in load_dataset(spec, task="masked-token", mask_token=M).records] == ["12", "13"]
    ds = load_dataset(spec, task="masked-token", mask_token=M, id_column="n")
    assert [r.id for r in ds.records] == ["x", "y"] and ds.columns["id"] == "n"
    # Without pairID: the row number.
    spec = write_jsonl(tmp_path / "c.jsonl", [{"sentence_good": "a b", "sentence_bad": "a c"}])
    assert load_dataset(spec, task="masked-token", mask_token=M).records == [lm(0, "0", "a [MASK]", "b", "c")]


def test_blimp_from_the_hub(monkeypatch):
    # The Hugging Face copy (nyu-mll/blimp) has pair_id (int) and no one-prefix fields.
    rows = [{"sentence_good": "Cats sleep.", "sentence_bad": "Cats sleeps.", "field": "morphology",
             "linguistics_term": "s-v", "UID": "agr", "simple_LM_method": True, "one_prefix_method": True,
             "two_prefix_method": False, "lexically_identical": True, "pair_id": 4}]
    module = types.ModuleType("datasets")

    class Fake:
        column_names = list(rows[0])

        def __len__(self):
            return len(rows)

        def __iter__(self):
            return iter(rows)

    module.load_dataset = lambda name, config=None, *, split=None: Fake()
    monkeypatch.setitem(sys.modules, "datasets", module)
    ds = load_dataset("nyu-mll/blimp/regular_plural_subject_verb_agreement_1:train", task="masked-token",
                      mask_token=M)
    assert ds.records == [lm(0, "agr_4", "Cats [MASK].", "sleep", "sleeps")]
    assert ds.columns["blimp_pair_id"] == "pair_id" and ds.kind == "hub"


def test_blimp_skipped_note_lists_five_rows(tmp_path):
    spec = write_jsonl(tmp_path / "b.jsonl", [blimp("a b", "b a", str(i)) for i in range(7)]
                       + [blimp("a b", "a c", "7")])
    ds = load_dataset(spec, task="masked-token", mask_token=M)
    assert ds.skipped == 7 and [r.id for r in ds.records] == ["agr_7"]
    assert ds.notes[0].endswith("rows 0, 1, 2, 3, 4, ...")


def test_blimp_limit_counts_source_rows(tmp_path):
    spec = write_jsonl(tmp_path / "b.jsonl", [blimp("a b", "b a", "0"), blimp("a b", "a c", "1"),
                                              blimp("d e", "d f", "2")])
    ds = load_dataset(spec, task="masked-token", mask_token=M, limit=2)
    assert [r.id for r in ds.records] == ["agr_1"] and ds.skipped == 1 and ds.n_rows == 3
    assert ds.notes == (f"skipped 1 of 2 BLiMP pairs in '{spec}' that do not differ in exactly one word (with the "
                        "same punctuation around it): rows 0",)


def test_blimp_duplicate_ids(tmp_path):
    spec = write_jsonl(tmp_path / "b.jsonl", [blimp("a b", "a c", "0"), blimp("d e", "d f", "0")])
    assert load_error(spec, task="masked-token", mask_token=M) == (
        f"id 'agr_0' appears in rows 0 and 1 of '{spec}': make the id column unique, or pass --id-column with a "
        "unique column")


def test_blimp_sentence_that_is_not_text(tmp_path):
    spec = write_jsonl(tmp_path / "b.jsonl", [blimp("a b", None, "0")])
    assert load_error(spec, task="masked-token", mask_token=M) == (
        f"row 0 of '{spec}' (line 1) has no text in column 'sentence_bad': fill it in or remove the row")


@pytest.mark.parametrize("flag", ["text_column", "pair_column", "target_column", "foil_column", "word_index_column"])
def test_blimp_with_column_flags_is_a_usage_error(tmp_path, flag):
    spec = write_jsonl(tmp_path / "b.jsonl", [blimp("a b", "a c", "0", text="x")])
    shown = "--" + flag.replace("_", "-")
    assert usage_error(spec, task="masked-token", mask_token=M, **{flag: "text"}) == (
        f"'{spec}' holds BLiMP minimal pairs (sentence_good, sentence_bad), which give the text, target and foil: "
        f"drop {shown}")


def test_blimp_evidence_moves_to_the_masked_text(tmp_path):
    spec = write_jsonl(tmp_path / "b.jsonl", [blimp("The cats are here.", "The cats is here.", "0",
                                                    ev=[[4, 8], [13, 17]])])
    assert load_dataset(spec, task="masked-token", mask_token=M, evidence_column="ev").records == [lm(
        0, "agr_0", "The cats [MASK] here.", "are", "is", ((0, 4, 8), (0, 16, 20)))]
    spec = write_jsonl(tmp_path / "c.jsonl", [blimp("a b", "a c", "0"), blimp("a b", "a c", "1", ev=[[2, 3]])])
    assert load_error(spec, task="masked-token", mask_token=M, evidence_column="ev") == (
        f"row 1 of '{spec}' (line 2): the evidence span [2, 3) overlaps the masked word: evidence must point at "
        "other words")


def test_bundled_blimp_sample_masked_and_next_token():
    spec = str(TASKS_DIR / "blimp_sample.jsonl")
    rows = [json.loads(line) for line in Path(spec).read_text().splitlines()]
    ds = load_dataset(spec, task="masked-token", mask_token=M)
    assert ds.n_rows == len(rows) == 12 and ds.skipped == 1 and len(ds.records) == 11
    assert [r.row for r in ds.records] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11]  # row 9 differs by word order
    assert ds.records[0] == lm(0, "regular_plural_subject_verb_agreement_1_0", "The gardeners [MASK] the roses.",
                               "water", "waters")
    assert ds.records[3] == lm(3, "determiner_noun_agreement_2_0", "[MASK] window was broken.", "That", "Those")
    for record in ds.records:
        row = rows[record.row]
        assert record.id == f"{row['UID']}_{row['pairID']}"
        assert record.text.replace(M, record.target) == row["sentence_good"]
        assert record.text.replace(M, record.foil) == row["sentence_bad"]

    ds = load_dataset(spec, task="next-token")
    assert ds.skipped == 3 and [r.row for r in ds.records] == [0, 1, 2, 4, 5, 6, 7, 8, 10]
    assert ds.notes == (f"skipped 3 of 12 BLiMP pairs in '{spec}' that have no one-word prefix (one_prefix_method "
                        "false): rows 3, 9, 11",)
    assert ds.columns == {"text": "one_prefix_prefix", "pair": None, "label": None, "id": None, "format": "blimp",
                          "target": "one_prefix_word_good", "foil": "one_prefix_word_bad", "blimp_uid": "UID",
                          "blimp_pair_id": "pairID"}
    assert ds.records[0] == lm(0, "regular_plural_subject_verb_agreement_1_0", "The gardeners", "water", "waters")
    for record in ds.records:
        row = rows[record.row]
        assert (record.text, record.target, record.foil) == (
            row["one_prefix_prefix"], row["one_prefix_word_good"], row["one_prefix_word_bad"])
        assert row["sentence_good"].startswith(f"{record.text} {record.target}")


# --- next-token -------------------------------------------------------------------------------------------------------


def test_next_token_prefixes(tmp_path):
    spec = write(tmp_path / "n.csv", "prefix,target,foil,id\nThe keys,are,is,k\nOnce upon a,time,,o\nHello,,,h\n")
    ds = load_dataset(spec, task="next-token")
    assert ds.records == [lm(0, "k", "The keys", "are", "is"), lm(1, "o", "Once upon a", "time"),
                          lm(2, "h", "Hello")]
    assert ds.columns == {"text": "prefix", "pair": None, "label": None, "id": "id", "target": "target",
                          "foil": "foil", "format": "plain"}
    assert (ds.task, ds.kind, ds.skipped) == ("next-token", "csv", 0)


def test_evidence_column_for_regression_and_next_token(tmp_path):
    spec = write_jsonl(tmp_path / "e.jsonl", [{"sentence1": "a cat", "sentence2": "a dog", "label": 2.5,
                                               "ev": [[2, 5], [1, 0, 1]]}])
    assert load_dataset(spec, task="regression", evidence_column="ev").records == [
        Record(0, "0", "a cat", "a dog", -1, ((0, 2, 5), (1, 0, 1)), value=2.5)]
    spec = write_jsonl(tmp_path / "n.jsonl", [{"text": "The keys", "target": "are", "ev": [[4, 8]]}])
    assert load_dataset(spec, task="next-token", evidence_column="ev").records == [
        lm(0, "0", "The keys", "are", evidence=((0, 4, 8),))]


def test_next_token_empty_prefix(tmp_path):
    spec = write_jsonl(tmp_path / "n.jsonl", [{"text": "ok"}, {"text": "  "}])
    assert load_error(spec, task="next-token") == (
        f"row 1 of '{spec}' (line 2) has an empty prefix in column 'text': next-token explains the word after the "
        "prefix, so write at least one word")


def test_next_token_keeps_a_mask_like_text_and_the_word_spacing(tmp_path):
    spec = write_jsonl(tmp_path / "n.jsonl", [{"text": "a [MASK] b ", "target": " c", "foil": "d"}])
    assert load_dataset(spec, task="next-token", mask_token=M).records == [lm(0, "0", "a [MASK] b ", " c", "d")]


# --- qa ---------------------------------------------------------------------------------------------------------------


CONTEXT = "Paris is the capital of France."


def test_qa_squad_rows(tmp_path):
    spec = write_jsonl(tmp_path / "q.jsonl", [
        {"id": "q1", "question": "Capital?", "context": CONTEXT,
         "answers": {"text": ["Paris", "Paris"], "answer_start": [0, 0]}},
        {"id": "q2", "question": "Of what?", "context": CONTEXT, "answers": [{"text": "France", "answer_start": 24}]},
        {"id": "q3", "question": "Unanswerable?", "context": CONTEXT, "answers": {"text": [], "answer_start": []}},
        {"id": "q4", "question": "Nothing?", "context": CONTEXT, "answers": None},
    ])
    ds = load_dataset(spec, task="qa")
    assert ds.records == [
        Record(0, "q1", "Capital?", CONTEXT, -1, ((1, 0, 5),), answer="Paris"),
        Record(1, "q2", "Of what?", CONTEXT, -1, ((1, 24, 30),), answer="France"),
        Record(2, "q3", "Unanswerable?", CONTEXT, -1, ()),
        Record(3, "q4", "Nothing?", CONTEXT, -1, ()),
    ]
    assert ds.columns == {"text": "question", "pair": "context", "label": None, "id": "id", "answers": "answers",
                          "format": "squad"}
    assert (ds.task, ds.skipped, ds.notes) == ("qa", 0, ())


def test_qa_answers_as_json_in_csv_with_flags(tmp_path):
    cell = json.dumps({"text": ["capital"], "answer_start": [13]}).replace('"', '""')
    spec = write(tmp_path / "q.csv", f'q,passage,gold\nWhat?,{CONTEXT},"{cell}"\n')
    ds = load_dataset(spec, task="qa", text_column="q", pair_column="passage", answers_column="gold")
    assert ds.records == [Record(0, "0", "What?", CONTEXT, -1, ((1, 13, 20),), answer="capital")]
    assert ds.columns == {"text": "q", "pair": "passage", "label": None, "id": None, "answers": "gold",
                          "format": "squad"}


def test_qa_without_answers_column(tmp_path):
    spec = write(tmp_path / "q.tsv", f"question\tcontext\nWhere?\t{CONTEXT}\n")
    ds = load_dataset(spec, task="qa")
    assert ds.records == [Record(0, "0", "Where?", CONTEXT, -1)]
    assert ds.columns["answers"] is None


def test_qa_parquet_struct_answers(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "q.parquet"
    pq.write_table(pa.table({"question": ["Who?"], "context": [CONTEXT],
                             "answers": [{"text": ["Paris"], "answer_start": [0]}]}), path)
    ds = load_dataset(str(path), task="qa")
    assert ds.records == [Record(0, "0", "Who?", CONTEXT, -1, ((1, 0, 5),), answer="Paris")]


def test_qa_from_the_hub(monkeypatch):
    module = types.ModuleType("datasets")
    rows = [{"id": "5733be", "title": "T", "context": CONTEXT, "question": "Which city?",
             "answers": {"text": ["Paris"], "answer_start": [0]}}]

    class Fake:
        column_names = list(rows[0])

        def __len__(self):
            return 1

        def __iter__(self):
            return iter(rows)

    module.load_dataset = lambda name, config=None, *, split=None: Fake()
    monkeypatch.setitem(sys.modules, "datasets", module)
    ds = load_dataset("squad:validation", task="qa")
    assert ds.records == [Record(0, "5733be", "Which city?", CONTEXT, -1, ((1, 0, 5),), answer="Paris")]
    assert ds.kind == "hub"


def test_qa_answer_start_not_matching(tmp_path):
    spec = write_jsonl(tmp_path / "q.jsonl", [{"question": "?", "context": CONTEXT,
                                               "answers": {"text": ["France"], "answer_start": [23]}}])
    assert load_error(spec, task="qa") == (
        f"row 0 of '{spec}' (line 1): the answer 'France' is not at character 23 of the context (found ' Franc'): "
        "fix answer_start, the 0-based character offset in the context")


def test_qa_answer_start_negative(tmp_path):
    spec = write_jsonl(tmp_path / "q.jsonl", [{"question": "?", "context": CONTEXT,
                                               "answers": {"text": ["."], "answer_start": [-1]}}])
    assert "is not at character -1 of the context (found '')" in load_error(spec, task="qa")


SHAPE = ('write answers like {"text": ["Denver Broncos"], "answer_start": [177]} (answer_start: 0-based character '
         'offset in the context)')


@pytest.mark.parametrize("cell, kind", [
    ("{not json", "not JSON"),
    ({"text": ["a"]}, "not SQuAD answers"),
    ({"text": ["a", "b"], "answer_start": [0]}, "not SQuAD answers"),
    (5, "not SQuAD answers"),
    ([{"answer": "x"}], "not SQuAD answers"),
])
def test_qa_malformed_answers(tmp_path, cell, kind):
    spec = write_jsonl(tmp_path / "q.jsonl", [{"question": "?", "context": CONTEXT, "answers": cell}])
    assert load_error(spec, task="qa") == f"row 0 of '{spec}' (line 1): the answers cell {cell!r} is {kind}: {SHAPE}"


@pytest.mark.parametrize("text, start", [("Paris", "0"), ("", 0), (None, 0), ("Paris", True)])
def test_qa_first_answer_of_the_wrong_type(tmp_path, text, start):
    spec = write_jsonl(tmp_path / "q.jsonl", [{"question": "?", "context": CONTEXT,
                                               "answers": {"text": [text], "answer_start": [start]}}])
    assert load_error(spec, task="qa") == (
        f"row 0 of '{spec}' (line 1): the first answer {text!r} at {start!r} is not an answer text and a whole "
        f"number: {SHAPE}")


def test_qa_missing_columns(tmp_path):
    spec = write_jsonl(tmp_path / "q.jsonl", [{"question": "?", "passage": CONTEXT}])
    assert load_error(spec, task="qa") == (
        f"no context column found in '{spec}' (columns: 'question', 'passage'): pass --pair-column")
    spec = write_jsonl(tmp_path / "r.jsonl", [{"query": "?", "context": CONTEXT}])
    assert load_error(spec, task="qa") == (
        f"no question column found in '{spec}' (columns: 'query', 'context'): pass --text-column")
    assert load_error(spec, task="qa", text_column="query", answers_column="gold") == (
        f"column 'gold' (from --answers-column) is not in '{spec}' (columns: 'query', 'context'): pass one of those")


# --- flags that do not belong to the task -----------------------------------------------------------------------------


@pytest.mark.parametrize("task, flag, applies", [
    ("classification", "target_column", "masked-token / next-token"),
    ("qa", "foil_column", "masked-token / next-token"),
    ("next-token", "word_index_column", "masked-token"),
    ("masked-token", "answers_column", "qa"),
    ("qa", "label_column", "classification / regression"),
    ("next-token", "label_column", "classification / regression"),
])
def test_flag_for_another_task(tmp_path, task, flag, applies):
    spec = write_jsonl(tmp_path / "d.jsonl", [{"text": "a"}])
    shown = "--" + flag.replace("_", "-")
    assert usage_error(spec, task=task, mask_token=M, **{flag: "x"}) == (
        f"{shown} applies to --task {applies}, not {task}: drop it")


def test_evidence_column_with_qa(tmp_path):
    spec = write_jsonl(tmp_path / "d.jsonl", [{"text": "a"}])
    assert usage_error(spec, task="qa", evidence_column="e") == (
        "--evidence-column applies to --task classification / regression / masked-token / next-token, not qa (qa "
        "reads the evidence span from the answers): drop it")


def test_unknown_task_and_missing_mask_token(tmp_path):
    spec = write_jsonl(tmp_path / "d.jsonl", [{"text": "a"}])
    assert usage_error(spec, task="generation") == (
        "unknown task 'generation': use one of classification, regression, masked-token, next-token, qa, generate")
    assert usage_error(spec, task="masked-token") == (
        "--task masked-token needs a model with a mask token (a masked-LM tokenizer): use a masked language model")


# --- the bundled examples -------------------------------------------------------------------------------------------


def test_bundled_regression_file():
    ds = load_dataset(str(TASKS_DIR / "regression.jsonl"), task="regression")
    assert 10 <= len(ds.records) <= 30 and ds.columns["pair"] == "sentence2"
    assert ds.records[0] == Record(0, "0", "A man is slicing a loaf of bread.",
                                   "Someone is cutting bread with a knife.", -1, value=4.2)
    assert all(r.pair and 0.0 <= r.value <= 5.0 and r.label == -1 for r in ds.records)


def test_bundled_masked_token_file():
    ds = load_dataset(str(TASKS_DIR / "masked_token.jsonl"), task="masked-token", mask_token=M)
    assert 10 <= len(ds.records) <= 30
    assert ds.records[0] == lm(0, "agr-0", "The keys to the old cabinet [MASK] on the kitchen table.", "are", "is")
    assert all(r.text.count(M) == 1 and r.target and r.foil and r.target != r.foil for r in ds.records)


def test_bundled_next_token_file():
    ds = load_dataset(str(TASKS_DIR / "next_token.jsonl"), task="next-token")
    assert 10 <= len(ds.records) <= 30
    assert ds.records[0] == lm(0, "nt-0", "The keys to the old cabinet", "are", "is")
    assert ds.records[-1] == lm(11, "nt-11", "Once upon a", "time")  # no foil: the target's logit alone


def test_bundled_qa_file():
    ds = load_dataset(str(TASKS_DIR / "qa_squad.jsonl"), task="qa")
    assert 10 <= len(ds.records) <= 30
    assert ds.records[3] == Record(3, "qa-3", "Who designed the bridge?", "The stone bridge over the Arle was designed "
                                   "by the engineer Marta Velde and opened to traffic in 1911.", -1, ((1, 60, 71),),
                                   answer="Marta Velde")
    for r in ds.records:
        (segment, start, end), = r.evidence
        assert segment == 1 and r.pair[start:end] == r.answer


def test_every_bundled_task_file_is_tested():
    assert {p.name for p in TASKS_DIR.iterdir()} == {
        "regression.jsonl", "masked_token.jsonl", "blimp_sample.jsonl", "agreement.tsv", "agreement_linzen.tsv",
        "next_token.jsonl", "qa_squad.jsonl"}


def test_dataset_defaults_keep_old_constructors_working():
    ds = Dataset(records=[], source="s", kind="jsonl", columns={}, n_rows=0, sha256=None, label_names=None)
    assert (ds.task, ds.skipped, ds.notes) == ("classification", 0, ())
    assert Record(0, "0", "t", None, 1) == Record(0, "0", "t", None, 1, None, None, None, None, None)


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_a_qa_file_is_not_classified_by_its_question_alone(task):
    """qa_squad.jsonl's text column would be found as 'question' (context left out): refused, unless named."""
    spec = str(TASKS_DIR / "qa_squad.jsonl")
    with pytest.raises(UsageError) as err:
        load_dataset(spec, task=task)
    assert str(err.value) == (f"'{spec}' has 'question' and 'context' columns (extractive QA): pass --task qa, or name "
                              "the text with --text-column (and --pair-column context to classify the pair)")
    ds = load_dataset(spec, task=task, text_column="question", pair_column="context")
    assert (ds.records[3].text, ds.records[3].pair[:16]) == ("Who designed the bridge?", "The stone bridge")
