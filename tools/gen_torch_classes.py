#!/usr/bin/env python3
"""Writes the optimizer classes of lbopt.torch (AdamW4bit, SGD8bit, ...) into bindings/python/lbopt/torch.py,
between its BEGIN/END GENERATED CLASSES lines, from the table CLASSES below.

Each class is a subclass of one of torch.py's LowBit* optimizers with its state kind (and, for Adam, the coupled
decay) fixed. Its __init__ spells out the base's parameters and defaults, read from the base's own __init__ in
torch.py, so that IDEs and type checkers see them; the rest (maximize, min_quant_size, ...) pass through
**common. Written out rather than made with type() at import for the same reason.

usage: tools/gen_torch_classes.py            rewrite the generated block of torch.py
       tools/gen_torch_classes.py --check    exit 1 (and show the difference) if the block is stale
"""
import argparse
import ast
import difflib
import pathlib
import sys

TORCH_PY = pathlib.Path(__file__).resolve().parents[1] / "bindings" / "python" / "lbopt" / "torch.py"
BEGIN = "# BEGIN GENERATED CLASSES: written by tools/gen_torch_classes.py from its table; edit that, then rerun it"
END = "# END GENERATED CLASSES"
WIDTH = 120

# Adam: torch.optim.Adam's L2 decay coupled into the gradient and its default weight_decay of 0. The class's
# docstring is its own line alone.
ADAM = {"fixed": {"adam": "True"}, "defaults": {"weight_decay": "0.0"}, "base_doc": False}

# (name, base, state kind, docstring[, variant]): the docstring is followed by the base's unless the variant says
# otherwise. The only place these facts live.
CLASSES = (
    ("AdamW4bit", "LowBitAdamW", "4bit", "AdamW with 4-bit states (block 128), 1.06 bytes/param."),
    ("AdamW8bit", "LowBitAdamW", "8bit", "AdamW with 8-bit dynamic-map states (block 256)."),
    ("AdamWFp8", "LowBitAdamW", "fp8", "AdamW with float8 e4m3 states (block 256)."),
    ("AdamW", "LowBitAdamW", "fp32", "AdamW with full-precision (fp32) states, fused in lbopt."),
    ("Adam4bit", "LowBitAdamW", "4bit", "Adam (L2 decay coupled into the gradient), 4-bit states.", ADAM),
    ("Adam8bit", "LowBitAdamW", "8bit", "Adam (L2 decay coupled into the gradient), 8-bit states.", ADAM),
    ("AdamFp8", "LowBitAdamW", "fp8", "Adam (L2 decay coupled into the gradient), float8 states.", ADAM),
    ("SGD4bit", "LowBitSGD", "4bit", "SGD with 4-bit states (block 128)."),
    ("SGD8bit", "LowBitSGD", "8bit", "SGD with 8-bit dynamic-map states (block 256)."),
    ("SGDFp8", "LowBitSGD", "fp8", "SGD with float8 e4m3 states (block 256)."),
    ("SGD", "LowBitSGD", "fp32", "SGD with full-precision (fp32) states."),
    ("Lion4bit", "LowBitLion", "4bit", "Lion with 4-bit states (block 128)."),
    ("Lion8bit", "LowBitLion", "8bit", "Lion with 8-bit dynamic-map states (block 256)."),
    ("LionFp8", "LowBitLion", "fp8", "Lion with float8 e4m3 states (block 256)."),
    ("Lion", "LowBitLion", "fp32", "Lion with full-precision (fp32) states."),
    ("AdEMAMix4bit", "LowBitAdEMAMix", "4bit", "AdEMAMix with 4-bit states (block 128)."),
    ("AdEMAMix8bit", "LowBitAdEMAMix", "8bit", "AdEMAMix with 8-bit dynamic-map states (block 256)."),
    ("AdEMAMixFp8", "LowBitAdEMAMix", "fp8", "AdEMAMix with float8 e4m3 states (block 256)."),
    ("AdEMAMix", "LowBitAdEMAMix", "fp32", "AdEMAMix with full-precision (fp32) states."),
    ("Muon4bit", "LowBitMuon", "4bit", "Muon with a 4-bit momentum (block 128), 0.53 bytes/param."),
    ("Muon8bit", "LowBitMuon", "8bit", "Muon with an 8-bit dynamic-map momentum (block 256)."),
    ("MuonFp8", "LowBitMuon", "fp8", "Muon with a float8 e4m3 momentum (block 256)."),
    ("Muon", "LowBitMuon", "fp32", "Muon with a full-precision (fp32) momentum."),
)


def base_signatures(source):
    """{class name: (positional [(name, default source)], keyword-only [...], **name)} of the __init__ of every
    class of torch.py, read from its source (the generator needs neither torch nor the C library)."""
    out = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        if init is None:
            continue
        a = init.args
        if a.posonlyargs or a.vararg:
            raise SystemExit(f"gen_torch_classes: {node.name}.__init__ has positional-only or *args parameters")
        seg = lambda d: None if d is None else ast.get_source_segment(source, d)  # noqa: E731
        defaults = [None] * (len(a.args) - len(a.defaults)) + list(a.defaults)
        positional = [(p.arg, seg(d)) for p, d in zip(a.args, defaults)][1:]  # without self
        keyword = [(p.arg, seg(d)) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
        out[node.name] = (positional, keyword, a.kwarg.arg if a.kwarg else None)
    return out


def wrap(head, items, tail, indent):
    """head + items joined by ", " + tail, broken into lines of at most WIDTH characters, continuation lines
    aligned under the first item."""
    lines, line = [], indent + head
    pad = " " * len(line)
    for i, item in enumerate(items):
        text = item + (", " if i + 1 < len(items) else tail)
        if len(line) + len(text.rstrip()) > WIDTH and line != pad and line != indent + head:
            lines.append(line.rstrip())
            line = pad
        line += text
    lines.append(line)
    return lines


def render_class(name, base, kind, doc, variant, signatures):
    variant = variant or {}
    if base not in signatures:
        raise SystemExit(f"gen_torch_classes: {name}'s base {base} has no __init__ in torch.py")
    positional, keyword, common = signatures[base]
    if common is None:
        raise SystemExit(f"gen_torch_classes: {base}.__init__ takes no **kwargs to pass state_kind through")
    fixed = {**variant.get("fixed", {}), "state_kind": f'"{kind}"'}
    defaults = variant.get("defaults", {})
    for arg in list(fixed) + list(defaults):
        if arg != "state_kind" and arg not in dict(positional + keyword):
            raise SystemExit(f"gen_torch_classes: {name} fixes or changes {arg!r}, which {base}.__init__ lacks")

    def param(arg, default):
        default = defaults.get(arg, default)
        return arg if default is None else f"{arg}={default}"

    pos = [(a, d) for a, d in positional if a not in fixed]
    kw = [(a, d) for a, d in keyword if a not in fixed]
    params = ["self"] + [param(a, d) for a, d in pos] + (["*"] if kw else []) + [param(a, d) for a, d in kw]
    params.append("**" + common)
    # a fixed value wins over the same key given by the caller, as when these classes forwarded **kwargs
    forced = ", ".join(f'"{k}": {v}' for k, v in fixed.items())
    args = [pos[0][0]] + [f"{a}={a}" for a, _ in pos[1:] + kw] + [f"**{{**{common}, {forced}}}"]
    lines = [f"class {name}({base}):", f'    """{doc}"""']
    if variant.get("base_doc", True):
        lines.append(f'    __doc__ += "\\n" + {base}.__doc__')
    lines.append("")
    lines += wrap("def __init__(", params, "):", "    ")
    lines += wrap("super().__init__(", args, ")", "        ")
    return lines


def render_block(source):
    """The generated block (its BEGIN and END lines included) for torch.py's current source."""
    signatures = base_signatures(source)
    lines = [BEGIN]
    for row in CLASSES:
        name, base, kind, doc = row[:4]
        lines += ["", ""] + render_class(name, base, kind, doc, row[4] if len(row) > 4 else None, signatures)
    lines += ["", ""] + wrap("__all__ += [", [f'"{row[0]}"' for row in CLASSES], "]", "")
    lines.append(END)
    return "\n".join(lines) + "\n"


def regenerate(source):
    """torch.py's source with its generated block rewritten."""
    start, end = source.find(BEGIN + "\n"), source.find(END + "\n")
    if start < 0 or end < start:
        raise SystemExit(f"gen_torch_classes: {TORCH_PY} has no {BEGIN!r} ... {END!r} block")
    return source[:start] + render_block(source) + source[end + len(END) + 1:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if torch.py's generated block is stale")
    args = ap.parse_args()
    old = TORCH_PY.read_text(encoding="utf-8")
    new = regenerate(old)
    if args.check:
        if new != old:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                       str(TORCH_PY), "generated"))
            print(f"{TORCH_PY}: the generated classes are stale; run tools/gen_torch_classes.py", file=sys.stderr)
            return 1
        return 0
    if new != old:
        TORCH_PY.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
