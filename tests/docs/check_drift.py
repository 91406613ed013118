#!/usr/bin/env python3
"""Fails when the documentation drifts from the code on two lists a user relies on.

Usage: check_drift.py REPOSITORY_ROOT [--keys-doc FILE] [--list-keys]

1. Optimizer types. The code's types are the values of `enum class optimizer_type` in
   optim/optimizer.hpp with their DeepSpeed names (`case optimizer_type::x: return "Name";`
   in optim/*.cpp); the names the config reader accepts (`t == "name"`) and the "known: ..."
   list of its error message must agree with them. A document names the types in its *type
   statements*: each list item, table row or paragraph that contains `optimizer.type` in
   backticks (see "entry" below); the types are the backticked capitalised words there.
   Checked: docs/architecture.md and the config-keys document (below), which must have one,
   and the type statements under a heading containing "optimizer" in other docs/*.md.

2. Config keys. The accepted keys are extracted from the C++ readers (drift_code.py, beside
   this file): every .cpp file under core/ kernels/ models/ optim/ io/ actors/ tools/ that
   calls `cfg.read(...)` and friends or declares a `param_reader`. It follows, function by
   function, `param_reader` prefixes, `cfg.read/require/get/get_or/has("key")`,
   `reader.read/require("name")`, `cfg.know`/`accept`, string constants, range-for loops
   over string lists, lambdas and helper functions (with their call sites and header
   defaults), and fails with exit status 2, naming the line, when a key argument is an
   expression it cannot follow.
     - read keys: read, required, got or tested with cfg.has. Each must be documented.
     - ignored keys: only marked known (`cfg.know`, DeepSpeed names accepted and ignored) or
       accepted as a whole subtree (`cfg.accept`). They may be documented; need not be.
     - tables: keys with accepted keys under them (`optimizer.params`). May be named.
   The config-keys document is docs/config.md when it exists, else the "Configuration
   keys" section of README.md (up to the next heading of its level or above). It names a
   key in an *entry*: a top-level list item (with its continuation lines and nested items)
   or a row of a table whose header's first column is "key" (or "keys"). The entry's *head*
   is a row's first column, or an item's text before its first colon (outside backticks and
   parentheses). Each backticked name in the head, outside parentheses, is a documented key:
   a dotted path as written (`fp16.loss_scale`); a bare name in the table of the dotted key
   before it in the same head ("`fp16.enabled` and `loss_scale`"), else in the table that
   the heading above names in backticks ("### The NVMe engine: `aio`"), else at the top
   level (`seed`). When the head's last key is a table, named `x.*` or one the code reads
   keys under (`optimizer.params`), the bare backticked names outside parentheses in the rest
   of the entry are keys of that table too ("`model.*`: `num_layers`, `hidden_size`").
   Values and references therefore go in parentheses or after the colon of an entry whose
   head is not a table. Every read key must be documented; every documented key accepted.

--keys-doc FILE checks FILE (whole) as the config-keys document instead; --list-keys prints
the extracted keys by kind. Exit status: 0 no drift, 1 drift (each difference named with
the file and the key or type), 2 the code could not be read.
"""
import argparse
import pathlib
import re
import sys

sys.dont_write_bytecode = True  # run from the source tree: leave no __pycache__ there
from drift_code import CannotFollow, Extractor, code_optimizer_types  # noqa: E402

# ---------------------------------------------------------------------------------------
# Reading the documents


def md_cells(row):
    """The cells of a markdown table row, splitting at | outside backticks."""
    cells, cur, code = [], '', False
    body = row.strip()
    body = body[1:] if body.startswith('|') else body
    i = 0
    while i < len(body):
        c = body[i]
        if c == '\\' and i + 1 < len(body):
            cur += body[i:i + 2]
            i += 2
            continue
        if c == '`':
            code = not code
        if c == '|' and not code:
            cells.append(cur.strip())
            cur = ''
        else:
            cur += c
        i += 1
    if cur.strip():
        cells.append(cur.strip())
    return cells


class Entry:
    """A table row, a top-level list item (nested items included) or a paragraph."""

    def __init__(self, kind, line, head, body, key_table=False, section=None, heading=''):
        self.kind, self.line, self.head, self.body = kind, line, head, body
        self.key_table, self.section, self.heading = key_table, section, heading

    def text(self):
        return self.head + ' ' + self.body


def split_head(text):
    """An item's text before its first colon outside backticks and parentheses, and the rest."""
    depth, code = 0, False
    for i, c in enumerate(text):
        if c == '`':
            code = not code
        elif not code and c == '(':
            depth += 1
        elif not code and c == ')':
            depth = max(0, depth - 1)
        elif not code and depth == 0 and c == ':':
            return text[:i], text[i + 1:]
    return text, ''


def entries(lines):
    """The entries of a markdown text, each with the key table its heading names, if any."""
    out, section, heading, i = [], None, '', 0
    while i < len(lines):
        number, text = lines[i]
        if text.startswith('```'):
            i += 1
            while i < len(lines) and not lines[i][1].startswith('```'):
                i += 1
            i += 1
            continue
        if re.match(r'^#{1,6}\s', text):
            names = [t for t in backticked(text, keep_parens=True) if DOC_KEY.match(t)]
            section = names[-1] if names else None
            heading = text
            i += 1
        elif text.lstrip().startswith('|') and i + 1 < len(lines) and \
                re.match(r'^\s*\|?\s*:?-{3,}', lines[i + 1][1]):
            header = md_cells(text)
            key_table = bool(header) and re.fullmatch(r'keys?', header[0].strip().lower()) is not None
            i += 2
            while i < len(lines) and lines[i][1].lstrip().startswith('|'):
                cells = md_cells(lines[i][1])
                if cells:
                    out.append(Entry('row', lines[i][0], cells[0], ' | '.join(cells[1:]), key_table, section,
                                     heading))
                i += 1
        elif re.match(r'^[-*+]\s', text):
            own, nested = [text[2:]], []
            i += 1
            while i < len(lines) and lines[i][1].startswith((' ', '\t')) and lines[i][1].strip():
                (nested if nested or re.match(r'^\s+[-*+]\s', lines[i][1]) else own).append(lines[i][1].strip())
                i += 1
            head, rest = split_head(' '.join(own))
            out.append(Entry('item', number, head, rest + ' ' + ' '.join(nested), True, section, heading))
        elif text.strip():
            para = [text]
            i += 1
            while i < len(lines) and lines[i][1].strip() and not re.match(r'^(#|[-*+]\s|\||```)', lines[i][1]):
                para.append(lines[i][1])
                i += 1
            out.append(Entry('para', number, ' '.join(para), '', heading=heading))
        else:
            i += 1
    return out


def backticked(text, keep_parens=False):
    """The backticked words of `text`, outside parentheses unless keep_parens."""
    words, depth, code, cur = [], 0, False, ''
    for c in text:
        if c == '`':
            if code and (keep_parens or depth == 0):
                words.append(cur.strip())
            code, cur = not code, ''
        elif code:
            cur += c
        elif c == '(':
            depth += 1
        elif c == ')':
            depth = max(0, depth - 1)
    return words


DOC_KEY = re.compile(r'^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*(\.\*)?$')


def documented_keys(lines, key_tables):
    """key -> line number of the entry naming it (see the module's comment for the rules)."""
    keys = {}
    for e in entries(lines):
        if not e.key_table:
            continue
        base, last = e.section or '', None
        for token in backticked(e.head):
            if not DOC_KEY.match(token):
                continue
            if '.' in token:
                key = token
                base = token.rsplit('.', 1)[0] if not token.endswith('.*') else token[:-2]
            else:
                key = base + '.' + token if base else token
            keys.setdefault(key, e.line)
            last = key
        table = last[:-2] if last and last.endswith('.*') else last
        if table and (last.endswith('.*') or table in key_tables):
            for token in backticked(e.body):
                if DOC_KEY.match(token) and '.' not in token:
                    keys.setdefault(table + '.' + token, e.line)
    return keys


def prose_mention(lines, key):
    """The first line naming `key` in backticks, or its last part beside its table's name."""
    parent, _, leaf = key.rpartition('.')
    for number, text in lines:
        if f'`{key}`' in text:
            return number
        if parent and f'`{leaf}`' in text and re.search(r'`%s(\.[\w*]+)?`' % re.escape(parent), text):
            return number
    return None


def section(lines, title):
    """The lines from the heading containing `title` to the next heading of its level or above."""
    start = None
    for i, (_, text) in enumerate(lines):
        if start is None:
            if re.match(r'^#{1,4}\s', text) and title.lower() in text.lower():
                start = i
                level = len(text) - len(text.lstrip('#'))
        elif re.match(r'^#{1,%d}\s' % level, text):
            return lines[start:i]
    return lines[start:] if start is not None else []


def numbered(path):
    return list(enumerate(path.read_text(encoding='utf-8').split('\n'), 1))


def type_statements(lines, under_optimizer_heading=False):
    """(line, the backticked capitalised words) of each entry that names `optimizer.type`."""
    found = []
    for e in entries(lines):
        if under_optimizer_heading and 'optimizer' not in e.heading.lower():
            continue
        if '`optimizer.type`' in e.text():
            words = {w for w in re.findall(r'`([^`]+)`', e.text()) if re.fullmatch(r'[A-Z][A-Za-z0-9]*', w)}
            found.append((e.line, words))
    return found


# ---------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('root')
    ap.add_argument('--keys-doc', help='the config-keys document to check (whole file)')
    ap.add_argument('--list-keys', action='store_true', help='print the extracted keys and exit')
    a = ap.parse_args()
    root = pathlib.Path(a.root).resolve()
    failures = []

    try:
        read, ignored, key_tables, subtrees = Extractor(root).extract()
        types, type_problems = code_optimizer_types(root)
    except CannotFollow as e:
        print(f'check_drift: cannot read the code: {e}', file=sys.stderr)
        return 2
    if a.list_keys:
        for title, keys in (('read', read), ('ignored', ignored), ('tables', key_tables)):
            print(f'# {title} ({len(keys)})')
            print('\n'.join(sorted(keys)))
        return 0
    failures += type_problems

    # The config-keys document.
    if a.keys_doc:
        keys_path = pathlib.Path(a.keys_doc)
        keys_lines = numbered(keys_path)
        keys_name = str(keys_path)
    elif (root / 'docs' / 'config.md').exists():
        keys_lines = numbered(root / 'docs' / 'config.md')
        keys_name = 'docs/config.md'
    else:
        keys_lines = section(numbered(root / 'README.md'), 'Configuration keys')
        keys_name = 'README.md ("Configuration keys")'
        if not keys_lines:
            failures.append('README.md: no "Configuration keys" section and no docs/config.md')

    # 1. Optimizer types.
    docs = [('docs/architecture.md', numbered(root / 'docs' / 'architecture.md'), True),
            (keys_name, keys_lines, True)]
    for md in sorted((root / 'docs').glob('*.md')):
        rel = str(md.relative_to(root))
        if rel in ('docs/architecture.md', 'docs/config.md') or str(md) == str(a.keys_doc or ''):
            continue
        lines = numbered(md)
        if any(re.match(r'^#+\s.*optimizer', t, re.I) for _, t in lines):
            docs.append((rel, lines, False))
    for name, lines, required in docs:
        statements = type_statements(lines, under_optimizer_heading=not required)
        if not statements:
            if required:
                failures.append(f'{name}: names no optimizer types (no paragraph or table row with `optimizer.type`)')
            continue
        named = set().union(*(w for _, w in statements))
        at = ', '.join(f'line {n}' for n, _ in statements)
        for t in types:
            if t not in named:
                failures.append(f'{name} ({at}): optimizer type {t} is missing (optim/optimizer.hpp has it)')
        for t in sorted(named - set(types)):
            failures.append(f'{name} ({at}): names optimizer type {t}, which optim/optimizer.hpp does not have')

    # 2. Config keys.
    if keys_lines:
        documented = documented_keys(keys_lines, key_tables)
        if not documented:
            failures.append(f'{keys_name}: documents no key (no list item or table headed "key" names one)')
        accepted = read | ignored | key_tables
        for key in sorted(read - set(documented)):
            hint = prose_mention(keys_lines, key)
            hint = f' (named on line {hint}, but not at the head of an entry)' if hint else ''
            failures.append(f'{keys_name}: config key {key} is read by the code but not documented{hint}')
        for key, line in sorted(documented.items()):
            if key.endswith('.*'):
                if not any(k.startswith(key[:-1]) for k in accepted):
                    failures.append(f'{keys_name}:{line}: names table {key}, which no config reader reads')
                continue
            if key in accepted or any(key.startswith(s + '.') for s in subtrees):
                continue
            failures.append(f'{keys_name}:{line}: documents config key {key}, which no config reader accepts')

    for f in failures:
        print(f'FAIL: {f}', file=sys.stderr)
    if failures:
        print(f'{len(failures)} difference(s) between the documentation and the code', file=sys.stderr)
        return 1
    print(f'no drift: {len(types)} optimizer types; {len(read)} config keys documented '
          f'({len(ignored)} accepted and ignored) in {keys_name}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
