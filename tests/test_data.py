"""Tests for compute.data: formats, column detection, labels, --limit, errors and the hub path."""

from __future__ import annotations

import hashlib
import json
import sys
import types
from pathlib import Path

import pytest

from compute.data import Dataset, Record, load_dataset
from compute.errors import AttrscopeError, UsageError

SST2_DEV = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "sst2" / "dev.tsv"


def write(path: Path, text: str, encoding: str = "utf-8") -> str:
    path.write_text(text, encoding=encoding, newline="")
    return str(path)


def write_jsonl(path: Path, rows: list[dict]) -> str:
    return write(path, "".join(json.dumps(r) + "\n" for r in rows))


def load_error(spec, **kwargs) -> str:
    """The message of the AttrscopeError that load_dataset raises; it must be one line."""
    with pytest.raises(AttrscopeError) as info:
        load_dataset(spec, **kwargs)
    message = str(info.value)
    assert message and "\n" not in message, message
    return message


# --- formats --------------------------------------------------------------------------------------------


def test_jsonl_reads_records_and_skips_blank_lines(tmp_path):
    spec = write(tmp_path / "d.jsonl", '{"text": "good film ", "label": 1}\n\n{"text": "bad", "label": 0}\n   \n')
    ds = load_dataset(spec)
    assert isinstance(ds, Dataset)
    assert ds.records == [Record(0, "0", "good film ", None, 1), Record(1, "1", "bad", None, 0)]
    assert ds.kind == "jsonl" and ds.source == spec and ds.n_rows == 2
    assert ds.columns == {"text": "text", "pair": None, "label": "label", "id": None}
    assert ds.sha256 == hashlib.sha256(Path(spec).read_bytes()).hexdigest()
    assert ds.label_names is None


def test_csv_with_quotes_and_bom(tmp_path):
    spec = write(tmp_path / "d.csv", 'sentence,label\n"a, quoted ""x"" cell",1\nplain ,0\n', encoding="utf-8-sig")
    ds = load_dataset(spec)
    assert ds.kind == "csv"
    assert ds.columns["text"] == "sentence"  # the BOM is not part of the first column name
    assert [(r.text, r.label) for r in ds.records] == [('a, quoted "x" cell', 1), ("plain ", 0)]


def test_tsv_keeps_quotes_literal_and_trailing_spaces(tmp_path):
    spec = write(tmp_path / "d.tsv", 'sentence\tlabel\n"quoted start ...\t1\nit \'s "fine" \t0\n')
    ds = load_dataset(spec)
    assert ds.kind == "tsv"
    assert [r.text for r in ds.records] == ['"quoted start ...', 'it \'s "fine" ']
    assert [r.label for r in ds.records] == [1, 0]


def test_tsv_with_crlf_line_endings(tmp_path):
    spec = write(tmp_path / "d.tsv", "text\tlabel\r\nhello \t1\r\n")
    assert load_dataset(spec).records == [Record(0, "0", "hello ", None, 1)]


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "d.parquet"
    table = pa.table({"idx": [10, 11], "sentence": ["x ", "y"], "label": [1, None]})
    pq.write_table(table, path)
    ds = load_dataset(str(path))
    assert ds.kind == "parquet" and ds.n_rows == 2
    assert ds.records == [Record(0, "10", "x ", None, 1), Record(1, "11", "y", None, -1)]
    assert ds.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_parquet_without_pyarrow(tmp_path, monkeypatch):
    path = tmp_path / "d.parquet"
    path.write_bytes(b"PAR1 not really parquet PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    assert load_error(str(path)) == "reading .parquet needs pyarrow: pip install 'attrscope[parquet]'"


def test_corrupt_parquet(tmp_path):
    pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "d.parquet"
    path.write_bytes(b"this is not parquet")
    assert "not a readable Parquet file" in load_error(str(path))


# --- columns --------------------------------------------------------------------------------------------


def test_auto_detection_is_case_insensitive_and_ordered(tmp_path):
    # Candidates are tried in their own order, not column order: "Text" wins over the earlier "Review".
    spec = write(tmp_path / "d.csv", "Review,Text,Gold_Label,GUID\nr,t,1,g0\n")
    ds = load_dataset(spec)
    assert ds.columns == {"text": "Text", "pair": None, "label": "Gold_Label", "id": "GUID"}
    assert ds.records == [Record(0, "g0", "t", None, 1)]


@pytest.mark.parametrize(
    "first, second",
    [("sentence1", "sentence2"), ("premise", "hypothesis"), ("question1", "question2")],
)
def test_pairs_are_auto_detected(tmp_path, first, second):
    spec = write_jsonl(tmp_path / "d.jsonl", [{first: "a", second: "b", "label": 0}])
    ds = load_dataset(spec)
    assert ds.columns["text"] == first and ds.columns["pair"] == second
    assert ds.records[0].pair == "b"


def test_question_context_is_not_a_pair(tmp_path):
    """Nor the question alone (the context silently dropped): refused unless --text-column names the text."""
    spec = write_jsonl(tmp_path / "d.jsonl", [{"question": "q?", "context": "c"}])
    with pytest.raises(UsageError, match="pass --task qa"):
        load_dataset(spec)
    ds = load_dataset(spec, text_column="question")
    assert ds.columns["text"] == "question" and ds.columns["pair"] is None


def test_pair_not_auto_detected_for_explicit_text_column(tmp_path):
    spec = write_jsonl(tmp_path / "d.jsonl", [{"sentence1": "a", "sentence2": "b"}])
    ds = load_dataset(spec, text_column="sentence1")
    assert ds.columns["pair"] is None


def test_explicit_columns(tmp_path):
    spec = write_jsonl(tmp_path / "d.jsonl", [{"body": "a", "other": "b", "y": "1", "key": "k1", "label": 0}])
    ds = load_dataset(spec, text_column="body", pair_column="OTHER", label_column="y", id_column="key")
    assert ds.columns == {"text": "body", "pair": "other", "label": "y", "id": "key"}
    assert ds.records == [Record(0, "k1", "a", "b", 1)]


def test_ids_from_column_or_row_number(tmp_path):
    with_ids = write_jsonl(tmp_path / "a.jsonl", [{"text": "a", "idx": 7}, {"text": "b", "idx": 9}])
    without = write_jsonl(tmp_path / "b.jsonl", [{"text": "a"}, {"text": "b"}])
    assert [r.id for r in load_dataset(with_ids).records] == ["7", "9"]
    assert [r.id for r in load_dataset(without).records] == ["0", "1"]


def test_missing_optional_fields_in_jsonl(tmp_path):
    spec = write_jsonl(tmp_path / "d.jsonl", [{"text": "a", "label": 1}, {"text": "b"}])
    assert [r.label for r in load_dataset(spec).records] == [1, -1]


# --- labels ---------------------------------------------------------------------------------------------


def test_string_labels_via_label2id_case_insensitive(tmp_path):
    spec = write(tmp_path / "d.csv", "text,label\na,Positive\nb,negative\nc,POSITIVE\n")
    ds = load_dataset(spec, label2id={"negative": 0, "positive": 1})
    assert [r.label for r in ds.records] == [1, 0, 1]
    assert ds.label_names == {"Positive": 1, "negative": 0, "POSITIVE": 1}


def test_integer_strings_are_indices(tmp_path):
    spec = write(tmp_path / "d.csv", "text,label\na,1\nb,0.0\nc, 2 \n")
    ds = load_dataset(spec, num_labels=3)
    assert [r.label for r in ds.records] == [1, 0, 2]
    assert ds.label_names is None


def test_default_transformers_label_names(tmp_path):
    spec = write(tmp_path / "d.csv", "text,label\na,LABEL_1\nb,label_0\n")
    ds = load_dataset(spec, label2id={"LABEL_0": 0, "LABEL_1": 1})
    assert [r.label for r in ds.records] == [1, 0]
    assert ds.label_names == {"LABEL_1": 1, "label_0": 0}


def test_label_k_rejected_when_model_has_real_names(tmp_path):
    spec = write(tmp_path / "d.csv", "text,label\na,LABEL_1\n")
    message = load_error(spec, label2id={"negative": 0, "positive": 1})
    assert "'LABEL_1'" in message and "'negative', 'positive'" in message


def test_unlabelled_dataset_and_empty_cells(tmp_path):
    no_label = write_jsonl(tmp_path / "a.jsonl", [{"text": "a"}])
    ds = load_dataset(no_label)
    assert ds.columns["label"] is None and ds.records[0].label == -1
    empty_cells = write(tmp_path / "b.tsv", "sentence\tlabel\na\t\nb\t-1\nc\t1\n")
    assert [r.label for r in load_dataset(empty_cells, num_labels=2).records] == [-1, -1, 1]


# --- limit ----------------------------------------------------------------------------------------------


def test_limit_keeps_first_records_and_counts_all_rows(tmp_path):
    spec = write_jsonl(tmp_path / "d.jsonl", [{"text": str(i)} for i in range(5)])
    ds = load_dataset(spec, limit=2)
    assert [r.text for r in ds.records] == ["0", "1"] and ds.n_rows == 5
    assert len(load_dataset(spec, limit=100).records) == 5


def test_limit_skips_checks_on_rows_it_does_not_keep(tmp_path):
    spec = write_jsonl(tmp_path / "d.jsonl", [{"text": "a", "label": 0}, {"text": "b", "label": "??"}])
    assert len(load_dataset(spec, limit=1).records) == 1


@pytest.mark.parametrize("limit", [0, -3])
def test_non_positive_limit_is_a_usage_error(tmp_path, limit):
    spec = write_jsonl(tmp_path / "d.jsonl", [{"text": "a"}])
    with pytest.raises(UsageError) as info:
        load_dataset(spec, limit=limit)
    assert info.value.exit_code == 2 and "\n" not in str(info.value)


# --- errors ---------------------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    assert load_error("x.tsv") == "dataset file 'x.tsv' not found: check the path"
    assert "not found" in load_error(str(tmp_path / "nope" / "d.jsonl"))


def test_unknown_extension_lists_supported(tmp_path):
    spec = write(tmp_path / "d.txt", "hello\n")
    message = load_error(spec)
    assert all(ext in message for ext in (".jsonl", ".csv", ".tsv", ".parquet"))


def test_empty_file_and_no_rows(tmp_path):
    assert "is empty" in load_error(write(tmp_path / "a.tsv", ""))
    assert "is empty" in load_error(write(tmp_path / "b.jsonl", "\n\n"))
    assert "no rows" in load_error(write(tmp_path / "c.csv", "text,label\n"))


def test_bad_jsonl_line_names_the_line(tmp_path):
    spec = write(tmp_path / "d.jsonl", '{"text": "a"}\n\n{"text": oops}\n')
    assert "line 3" in load_error(spec)
    spec = write(tmp_path / "e.jsonl", '{"text": "a"}\n["not", "an", "object"]\n')
    assert "line 2" in load_error(spec)


def test_wrong_field_count_names_the_line(tmp_path):
    spec = write(tmp_path / "d.tsv", "sentence\tlabel\na\t1\nb\tc\t1\n")
    assert "line 3" in load_error(spec)


def test_missing_explicit_column_names_available(tmp_path):
    spec = write(tmp_path / "d.csv", "body,y\na,1\n")
    message = load_error(spec, label_column="label", text_column="body")
    assert "'label'" in message and "'body', 'y'" in message


def test_no_text_column_detected(tmp_path):
    spec = write(tmp_path / "d.csv", "body,y\na,1\n")
    message = load_error(spec)
    assert "'body', 'y'" in message and "--text-column" in message


def test_unmappable_label_names_value_and_known_labels(tmp_path):
    spec = write(tmp_path / "d.csv", "text,label\na,neutral\n")
    message = load_error(spec, label2id={"negative": 0, "positive": 1})
    assert "'neutral'" in message and "'negative', 'positive'" in message
    # Without label names only class indices can work.
    assert "'neutral'" in load_error(spec)


def test_label_out_of_range(tmp_path):
    spec = write(tmp_path / "d.csv", "text,label\na,1\nb,3\n")
    message = load_error(spec, num_labels=2)
    assert "label 3" in message and "0..1" in message and "row 1" in message
    # num_labels falls back to the size of label2id.
    assert "0..1" in load_error(spec, label2id={"negative": 0, "positive": 1})


def test_missing_text_cell_names_the_row(tmp_path):
    spec = write_jsonl(tmp_path / "d.jsonl", [{"text": "a"}, {"text": None}])
    assert "row 1" in load_error(spec)
    spec = write_jsonl(tmp_path / "e.jsonl", [{"sentence1": "a", "sentence2": "b"}, {"sentence1": "c"}])
    assert "row 1" in load_error(spec) and "'sentence2'" in load_error(spec)


def test_duplicate_ids(tmp_path):
    spec = write_jsonl(tmp_path / "d.jsonl", [{"text": "a", "id": "x"}, {"text": "b", "id": "x"}])
    assert "'x'" in load_error(spec)


def test_not_utf8(tmp_path):
    path = tmp_path / "d.csv"
    path.write_bytes("text\ncaf\u00e9\n".encode("latin-1"))
    assert "UTF-8" in load_error(str(path))


def test_split_with_local_file_is_a_usage_error(tmp_path):
    spec = write_jsonl(tmp_path / "d.jsonl", [{"text": "a"}])
    with pytest.raises(UsageError):
        load_dataset(spec, split="train")


# --- Hugging Face hub -----------------------------------------------------------------------------------


class FakeHubDataset:
    """The little of datasets.Dataset that compute.data uses: column_names, len, iteration."""

    def __init__(self, rows: list[dict]):
        self.rows = rows
        self.column_names = list(rows[0]) if rows else []

    def __len__(self):
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)


def fake_datasets(monkeypatch, load):
    module = types.ModuleType("datasets")
    module.load_dataset = load
    monkeypatch.setitem(sys.modules, "datasets", module)


def test_hub_success(monkeypatch):
    calls = []

    def load(name, config=None, *, split=None):
        calls.append((name, config, split))
        rows = [{"sentence": f"s{i} ", "label": i % 2, "idx": i} for i in range(4)]
        return FakeHubDataset(rows)

    fake_datasets(monkeypatch, load)
    ds = load_dataset("glue/sst2:validation", limit=3, label2id={"negative": 0, "positive": 1})
    assert calls == [("glue", "sst2", "validation")]
    assert ds.kind == "hub" and ds.sha256 is None and ds.n_rows == 4 and ds.source == "glue/sst2:validation"
    assert ds.records == [Record(i, str(i), f"s{i} ", None, i % 2) for i in range(3)]

    load_dataset("imdb", split="test")
    load_dataset("owner/name/config:train")
    assert calls[1:] == [("imdb", None, "test"), ("owner/name", "config", "train")]


def test_hub_test_split_without_labels(monkeypatch):
    fake_datasets(monkeypatch, lambda name, config=None, *, split=None: FakeHubDataset([{"text": "t", "label": -1}]))
    assert load_dataset("imdb:test", num_labels=2).records[0].label == -1


def test_hub_offline(monkeypatch):
    def load(name, config=None, *, split=None):
        try:
            raise OSError("[Errno -3] Temporary failure in name resolution")
        except OSError as e:
            raise ConnectionError("Couldn't reach 'glue' on the Hub (LocalEntryNotFoundError)") from e

    fake_datasets(monkeypatch, load)
    message = load_error("glue/sst2:validation")
    assert "offline" in message and "local" in message and "glue/sst2:validation" in message


def test_hub_other_failure(monkeypatch):
    def load(name, config=None, *, split=None):
        raise ValueError('Unknown split "dev".\nShould be one of [\'train\', \'validation\', \'test\'].')

    fake_datasets(monkeypatch, load)
    message = load_error("glue/sst2:dev")
    assert "Unknown split" in message and "offline" not in message


def test_hub_without_datasets_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    assert load_error("glue/sst2:validation") == (
        "loading 'glue/sst2:validation' from the Hugging Face hub needs the datasets package: "
        "pip install 'attrscope[hub]', or pass a local .jsonl/.csv/.tsv/.parquet file"
    )


def test_hub_needs_a_split(monkeypatch):
    fake_datasets(monkeypatch, lambda *a, **k: pytest.fail("should not load without a split"))
    assert "split" in load_error("imdb")
    with pytest.raises(UsageError):
        load_dataset("imdb:test", split="train")


def test_local_path_wins_over_hub_id(tmp_path, monkeypatch):
    fake_datasets(monkeypatch, lambda *a, **k: pytest.fail("an existing local path must not go to the hub"))
    (tmp_path / "imdb").mkdir()
    monkeypatch.chdir(tmp_path)
    spec = write_jsonl(tmp_path / "imdb" / "test.jsonl", [{"text": "a"}])
    assert load_dataset("imdb/test.jsonl").records[0].text == "a"
    assert spec.endswith("test.jsonl")
    assert "directory" in load_error("imdb")


# --- the real SST-2 dev set -----------------------------------------------------------------------------


@pytest.mark.shared
def test_sst2_dev():
    if not SST2_DEV.exists():
        pytest.skip(f"{SST2_DEV} is absent (../shared not mounted)")
    ds = load_dataset(str(SST2_DEV), label2id={"negative": 0, "positive": 1})
    assert ds.kind == "tsv" and ds.n_rows == 872 and len(ds.records) == 872
    assert ds.columns == {"text": "sentence", "pair": None, "label": "label", "id": None}
    assert {r.label for r in ds.records} == {0, 1}
    first = ds.records[0]
    assert first.text == "it 's a charming and often affecting journey . " and first.label == 1
    assert all(r.text.endswith(" ") for r in ds.records[:10])  # trailing spaces kept
    assert ds.sha256 == hashlib.sha256(SST2_DEV.read_bytes()).hexdigest()
