"""The C++ side of check_drift.py: the config keys the readers accept and the optimizer types.

Extractor follows the config reads of every .cpp file that has one (see check_drift.py for
what it understands); code_optimizer_types reads optim/optimizer.hpp and optim/*.cpp. Both
raise CannotFollow, naming the file and line, where the code is not of a form they know.
"""
import re

# ---------------------------------------------------------------------------------------
# Small C++ reading helpers


class CannotFollow(Exception):
    pass


class Unbound(Exception):
    """A key depends on a parameter of a function run without a caller: skipped."""


FREE = 'free parameter'


def strip_comments(text):
    """Comments become spaces (newlines kept); string and char literals are kept."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '/' and text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i))
            i = j
        elif c == '/' and text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j]))
            i = j
        elif c in '"\'':
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == '\\' else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def skip_literal(text, i):
    """Index just past the string or char literal starting at text[i]."""
    q = text[i]
    j = i + 1
    while j < len(text) and text[j] != q:
        j += 2 if text[j] == '\\' else 1
    return j + 1


def match_close(text, i):
    """text[i] is an opening bracket; the index of its partner (literals skipped)."""
    pairs = {'(': ')', '{': '}', '[': ']'}
    stack = [pairs[text[i]]]
    j = i + 1
    while j < len(text):
        c = text[j]
        if c in '"\'':
            j = skip_literal(text, j)
            continue
        if c in pairs:
            stack.append(pairs[c])
        elif c in ')}]':
            if c != stack[-1]:
                raise CannotFollow(f'unbalanced {c!r}')
            stack.pop()
            if not stack:
                return j
        j += 1
    raise CannotFollow('unclosed bracket')


def split_top(text, sep=','):
    """Splits at `sep` outside brackets, angle brackets of templates and literals."""
    parts, depth, start, j = [], 0, 0, 0
    while j < len(text):
        c = text[j]
        if c in '"\'':
            j = skip_literal(text, j)
            continue
        if c in '([{':
            depth += 1
        elif c in ')]}':
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(text[start:j])
            start = j + 1
        j += 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


STRING_LIT = re.compile(r'^"((?:[^"\\]|\\.)*)"$')
IDENT = re.compile(r'^[A-Za-z_]\w*$')


class Function:
    def __init__(self, path, name, params, body, body_pos, text, parent=None):
        self.path, self.name, self.body, self.body_pos = path, name, body, body_pos
        self.text, self.parent = text, parent
        self.params = []  # (name, default literal or None)
        for p in params:
            default = None
            if '=' in p:
                p, d = p.split('=', 1)
                m = STRING_LIT.match(d.strip())
                default = m.group(1) if m else None
            m = re.search(r'(\w+)\s*(\[\s*\])?\s*$', p.strip())
            if m:
                self.params.append((m.group(1), default, p))
        self.lambdas = {}  # name -> Function (lambdas defined in the body)
        self.returns = None  # for a one-statement lambda `return EXPR;`
        m = re.fullmatch(r'\s*return\s+(.*?);\s*', body, re.S)
        if m:
            self.returns = m.group(1)

    def line_of(self, offset):
        return self.text.count('\n', 0, self.body_pos + offset) + 1


def find_functions(path, text):
    """Top-level function definitions (inside namespaces), with their bodies."""
    found = []

    def scan(lo, hi):
        i, start = lo, lo
        while i < hi:
            c = text[i]
            if c in '"\'':
                i = skip_literal(text, i)
                continue
            if c in ';}':
                start = i + 1
            elif c == '{':
                close = match_close(text, i)
                header = '\n'.join(l for l in text[start:i].split('\n') if not l.lstrip().startswith('#')).strip()
                if re.match(r'^(inline\s+)?namespace\b', header):
                    scan(i + 1, close)
                elif header.endswith(')') or re.search(r'\)\s*(const|noexcept|override)\s*$', header):
                    h = re.sub(r'\s*(const|noexcept|override)\s*$', '', header)
                    open_at = h.rfind('(')
                    depth = 0
                    for k in range(len(h) - 1, -1, -1):  # the `(` matching the final `)`
                        if h[k] == ')':
                            depth += 1
                        elif h[k] == '(':
                            depth -= 1
                            if depth == 0:
                                open_at = k
                                break
                    m = re.search(r'(\w+)\s*$', h[:open_at])
                    if m and m.group(1) not in ('if', 'for', 'while', 'switch', 'catch'):
                        found.append(Function(path, m.group(1), split_top(h[open_at + 1:-1]),
                                              text[i + 1:close], i + 1, text))
                i = close + 1
                start = i
                continue
            i += 1

    scan(0, len(text))
    return found


# ---------------------------------------------------------------------------------------
# Following the config reads

SOURCE_FOLDERS = ('core', 'kernels', 'models', 'optim', 'io', 'actors', 'tools')
KEY_METHODS = {'read': 'read', 'require': 'read', 'get': 'read', 'get_or': 'read',
               'has': 'read', 'know': 'ignored', 'accept': 'accepted'}
READER_METHODS = {'read': 'read', 'require': 'read', 'accept': 'accepted'}
KEY_SHAPE = re.compile(r'^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*$')


class Extractor:
    def __init__(self, root):
        self.root = root
        self.files = {}  # rel path -> comment-free text
        self.functions = {}  # name -> [Function]
        self.lists = {}  # (rel path, name) -> [str]: string arrays and vectors of a file
        self.keys = {}  # key -> {kind: first "file:line"}
        self.header_defaults = {}  # function name -> {param: default}

    def load(self):
        pattern = re.compile(r'\bparam_reader\s+\w+\s*\(|\bcfg\.(read|require|know|accept|has|get)\b')
        for top in SOURCE_FOLDERS:
            for p in sorted((self.root / top).rglob('*.cpp')):
                text = strip_comments(p.read_text(encoding='utf-8', errors='replace'))
                if pattern.search(text):
                    rel = str(p.relative_to(self.root))
                    self.files[rel] = text
        if not self.files:
            raise CannotFollow('no config reader found (no cfg.read or param_reader in any .cpp)')
        for rel, text in self.files.items():
            for f in find_functions(rel, text):
                self.functions.setdefault(f.name, []).append(f)
            for m in re.finditer(r'\b(\w+)\s*(?:\[\s*\])?\s*=\s*\{', text):
                body = text[m.end() - 1:match_close(text, m.end() - 1) + 1]
                items = split_top(body[1:-1])
                if items and all(STRING_LIT.match(x) for x in items):
                    self.lists[(rel, m.group(1))] = [STRING_LIT.match(x).group(1) for x in items]
        # Defaults declared in headers: `name(..., std::string_view key = "optimizer")`.
        for h in sorted(h for top in SOURCE_FOLDERS for h in (self.root / top).rglob('*.hpp')):
            text = strip_comments(h.read_text(encoding='utf-8', errors='replace'))
            for name in self.functions:
                for m in re.finditer(r'\b%s\s*\(' % re.escape(name), text):
                    try:
                        close = match_close(text, m.end() - 1)
                    except CannotFollow:
                        continue
                    for p in split_top(text[m.end():close]):
                        d = re.match(r'.*?(\w+)\s*=\s*"([^"]*)"\s*$', p, re.S)
                        if d:
                            self.header_defaults.setdefault(name, {})[d.group(1)] = d.group(2)

    def record(self, key, kind, fn, offset):
        if not KEY_SHAPE.match(key):
            raise CannotFollow(f'"{key}" does not look like a config key')
        where = f'{fn.path}:{fn.line_of(offset)}'
        self.keys.setdefault(key, {}).setdefault(kind, where)

    # Expressions ------------------------------------------------------------------------
    def eval(self, expr, env, fn):
        """The set of strings `expr` may hold; CannotFollow when it is not a known form."""
        e = expr.strip()
        m = STRING_LIT.match(e)
        if m:
            return {m.group(1)}
        m = re.fullmatch(r'std::string(?:_view)?\s*\((.*)\)', e, re.S)
        if m:
            return self.eval(m.group(1), env, fn)
        m = re.fullmatch(r'(\w+)\.c_str\(\)', e)
        if m:
            return self.eval(m.group(1), env, fn)
        if IDENT.match(e):
            if env.get(e) is FREE:
                raise Unbound(e)
            if e in env and env[e] is not None:
                return env[e]
            raise CannotFollow(f'the value of {e}')
        plus = split_top(e, '+')
        if len(plus) > 1:
            out = {''}
            for part in plus:
                out = {a + b for a in out for b in self.eval(part, env, fn)}
            return out
        m = re.fullmatch(r'(\w+)\s*\.\s*key\s*\((.*)\)', e, re.S)
        if m and ('reader', m.group(1)) in env:
            prefixes = env[('reader', m.group(1))]
            return {p + '.' + c for p in prefixes for c in self.eval(m.group(2), env, fn)}
        m = re.fullmatch(r'(?:fmt::)?format\s*\((.*)\)', e, re.S)
        if m:
            args = split_top(m.group(1))
            templ = STRING_LIT.match(args[0])
            if not templ:
                raise CannotFollow(f'a format string in {e}')
            out = {templ.group(1)}
            for a in args[1:]:
                out = {t.replace('{}', v, 1) for t in out for v in self.eval(a, env, fn)}
            return out
        m = re.fullmatch(r'join_key\s*\((.*)\)', e, re.S)
        if m:
            a, b = split_top(m.group(1))
            return {x + '.' + y if x else y for x in self.eval(a, env, fn) for y in self.eval(b, env, fn)}
        m = re.fullmatch(r'(\w+)\s*\((.*)\)', e, re.S)
        if m:
            lam = self.lambda_in_scope(fn, m.group(1))
            if lam is not None and lam.returns is not None:
                out = set()
                for lenv in self.bind(lam, split_top(m.group(2)), env, fn):
                    out |= self.eval(lam.returns, lenv, lam)
                return out
        raise CannotFollow(f'the expression {e}')

    def lambda_in_scope(self, fn, name):
        while fn is not None:
            if name in fn.lambdas:
                return fn.lambdas[name]
            fn = fn.parent
        return None

    def bind(self, callee, args, env, fn):
        """Environments for calling `callee` with `args` evaluated in `env`."""
        base = dict(env) if callee.parent is not None else {}
        for (pname, default, ptype), arg in zip(callee.params, args):
            if 'param_reader' in ptype:
                m = re.fullmatch(r'(\w+)', arg)
                base[('reader', pname)] = env.get(('reader', m.group(1))) if m else None
                if base[('reader', pname)] is None:
                    del base[('reader', pname)]
                continue
            try:
                base[pname] = self.eval(arg, env, fn)
            except Unbound:
                base[pname] = FREE  # the caller's free parameter: skipped if a key depends on it
            except CannotFollow:
                base[pname] = None  # an error only if a key depends on it
        for pname, default, ptype in callee.params[len(args):]:
            d = default if default is not None else self.header_defaults.get(callee.name, {}).get(pname)
            if d is not None:
                base[pname] = {d}
        return [base]

    # Function bodies ----------------------------------------------------------------------
    def run(self):
        for fns in self.functions.values():
            for fn in fns:
                self.find_lambdas(fn)
        # Every function runs once with its own defaults; calls add runs with bound values.
        queue = []
        for fns in self.functions.values():
            for fn in fns:
                env = {}
                for pname, default, ptype in fn.params:
                    d = default if default is not None else self.header_defaults.get(fn.name, {}).get(pname)
                    env[pname] = {d} if d is not None else FREE
                queue.append((fn, env))
        seen = set()
        while queue:
            fn, env = queue.pop(0)
            sig = (id(fn), repr(sorted((str(k), sorted(v) if isinstance(v, set) else v) for k, v in env.items())))
            if sig in seen:
                continue
            seen.add(sig)
            queue.extend(self.walk(fn, env))

    def find_lambdas(self, fn):
        for m in re.finditer(r'\bauto\s+(\w+)\s*=\s*\[[^\]]*\]\s*\(', fn.body):
            close = match_close(fn.body, m.end() - 1)
            params = split_top(fn.body[m.end():close])
            brace = fn.body.find('{', close)
            end = match_close(fn.body, brace)
            lam = Function(fn.path, m.group(1), params, fn.body[brace + 1:end], fn.body_pos + brace + 1,
                           fn.text, parent=fn)
            lam.span = (m.start(), end + 1)
            fn.lambdas[lam.name] = lam
            self.find_lambdas(lam)

    def callees(self, fn, name):
        lam = self.lambda_in_scope(fn, name)
        if lam is not None:
            return [lam]
        fns = self.functions.get(name, [])
        same = [f for f in fns if f.path == fn.path]
        return same or (fns if len(fns) == 1 else [])

    def walk(self, fn, env):
        """Records the keys of one run of `fn` in `env`; returns the calls to follow."""
        body = fn.body
        spans = [lam.span for lam in fn.lambdas.values()]
        inside_lambda = lambda pos: any(a <= pos < b for a, b in spans)
        env = dict(env)
        events = []
        for m in re.finditer(r'(?:optim::)?\bparam_reader\s+(\w+)\s*\(', body):
            events.append((m.start(), 'reader', m))
        for m in re.finditer(r'(?:const\s+)?(?:std::string(?:_view)?|const\s+char\s*\*|char\s*\*|auto)\s+(\w+)\s*=\s*("(?:[^"\\]|\\.)*")\s*;', body):
            events.append((m.start(), 'const', m))
        for m in re.finditer(r'\bfor\s*\(\s*(?:const\s+)?[\w:<>]+\s*[\*&]?\s*(\w+)\s*:\s*', body):
            events.append((m.start(), 'for', m))
        for m in re.finditer(r'\b(\w+)\s*\.\s*(\w+)\s*(?:<[^;()<>]*>)?\s*\(', body):
            events.append((m.start(), 'method', m))
        for m in re.finditer(r'(?<![.\w>:])(?:\w+::)*(\w+)\s*(?:<[^;()<>]*>)?\s*\(', body):
            events.append((m.start(), 'call', m))
        events.sort(key=lambda t: t[0])
        follow = []
        for pos, kind, m in events:
            if inside_lambda(pos):
                continue
            try:
                if kind == 'reader':
                    close = match_close(body, m.end() - 1)
                    args = split_top(body[m.end():close])
                    env[('reader', m.group(1))] = self.eval(args[1], env, fn)
                elif kind == 'const':
                    env[m.group(1)] = {STRING_LIT.match(m.group(2)).group(1)}
                elif kind == 'for':
                    rest = body[m.end():]
                    if rest.startswith('{'):
                        items = split_top(rest[1:match_close(rest, 0)])
                        try:
                            values = set()
                            for it in items:
                                values |= self.eval(it, env, fn)
                        except CannotFollow:
                            values = None  # not strings: an error only if used as a key
                    else:
                        name = re.match(r'(\w+)\s*\)', rest)
                        values = None  # a range of something else: an error only if used as a key
                        if name:
                            values = set(self.lists.get((fn.path, name.group(1)), [])) or env.get(name.group(1))
                    env[m.group(1)] = values
                elif kind == 'method':
                    obj, method = m.group(1), m.group(2)
                    close = match_close(body, m.end() - 1)
                    args = split_top(body[m.end():close])
                    if not args:
                        continue
                    if obj == 'cfg' and method in KEY_METHODS:
                        for key in self.eval(args[0], env, fn):
                            self.record(key, KEY_METHODS[method], fn, pos)
                    elif ('reader', obj) in env and method in READER_METHODS:
                        for prefix in env[('reader', obj)]:
                            for child in self.eval(args[0], env, fn):
                                self.record(prefix + '.' + child, READER_METHODS[method], fn, pos)
                elif kind == 'call':
                    name = m.group(1)
                    if name in ('if', 'for', 'while', 'switch', 'return', 'sizeof'):
                        continue
                    targets = [c for c in self.callees(fn, name) if c is not fn]
                    if not targets:
                        continue
                    close = match_close(body, m.end() - 1)
                    args = split_top(body[m.end():close])
                    for callee in targets:
                        for cenv in self.bind(callee, args, env, fn):
                            follow.append((callee, cenv))
            except Unbound:
                continue
            except CannotFollow as e:
                raise CannotFollow(f'{fn.path}:{fn.line_of(pos)}: cannot follow {e}') from None
        return follow

    def extract(self):
        self.load()
        self.run()
        names = set(self.keys)
        tables = {k for k in names if any(o.startswith(k + '.') for o in names)}
        read = {k for k, kinds in self.keys.items() if 'read' in kinds} - tables
        ignored = {k for k in names - tables - read}
        subtrees = {k for k in ignored if 'accepted' in self.keys[k]}
        for anchor in ('train_micro_batch_size_per_gpu', 'optimizer.type'):
            if anchor not in read:
                raise CannotFollow(f'the readers no longer read {anchor}: the extraction is broken')
        return read, ignored, tables, subtrees


# ---------------------------------------------------------------------------------------
# The code's optimizer types


def code_optimizer_types(root):
    hpp = root / 'optim' / 'optimizer.hpp'
    text = strip_comments(hpp.read_text(encoding='utf-8'))
    m = re.search(r'enum\s+class\s+optimizer_type\b[^{]*\{([^}]*)\}', text)
    if not m:
        raise CannotFollow(f'{hpp.relative_to(root)}: no enum class optimizer_type')
    values = [v.split('=')[0].strip() for v in m.group(1).split(',') if v.strip()]
    names, parsed, known, problems = {}, {}, None, []
    for cpp in sorted((root / 'optim').glob('*.cpp')):
        t = strip_comments(cpp.read_text(encoding='utf-8'))
        for v, name in re.findall(r'case\s+optimizer_type::(\w+)\s*:\s*return\s+"([^"]+)"', t):
            names[v] = name
        for lit, v in re.findall(r'==\s*"([^"]+)"\s*\)\s*\w+\.type\s*=\s*optimizer_type::(\w+)', t):
            parsed[v] = lit
        k = re.search(r'unknown optimizer[^;]*?known:\s*([A-Za-z0-9, ]+)\)', t)
        if k:
            known = [w.strip() for w in k.group(1).split(',') if w.strip()]
    where = 'optim/optimizer_config.cpp'
    for v in values:
        if v not in names:
            problems.append(f'optim/optimizer.hpp: optimizer_type::{v} has no name in optimizer_name()')
        elif v not in parsed:
            problems.append(f'{where}: the config reader does not accept optimizer type {names[v]}')
        elif parsed[v] != names[v].lower():
            problems.append(f'{where}: type {names[v]} is read as "{parsed[v]}", expected "{names[v].lower()}"')
    code = [names[v] for v in values if v in names]
    if known is not None and sorted(known) != sorted(code):
        problems.append(f'{where}: the unknown-type message lists {", ".join(known)}; the types are {", ".join(code)}')
    return code, problems
