"""Extract the engines' option tables into test data (tests/fixtures/engine_options/).

Run by hand on the engines' unpacked release sources (nothing is downloaded here):

    pip download --no-deps vllm==0.33.0 -d SRC && (cd SRC && unzip -q vllm-0.33.0-*.whl)
    pip download --no-deps sglang==0.5.23 -d SRC && (cd SRC && unzip -q sglang-0.5.23-*.whl)
    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d SRC \
        && tar xzf SRC/llama_cpp_python-0.3.36.tar.gz -C SRC
    python scripts/extract_engine_options.py --vllm SRC --sglang SRC \
        --llama-cpp SRC/llama_cpp_python-0.3.36/vendor/llama.cpp

Writes one JSON file per engine, each naming the files it was read from:

- vllm-0.33.0.json: the fields of ``SpeculativeConfig`` (vllm/config/speculative.py; vLLM's
  config classes forbid unknown keys), the ``SpeculativeMethod`` literals, the ``MoEBackend``
  literals (vllm/config/kernel.py) and the option strings ``EngineArgs.add_cli_args`` registers
  by hand (vllm/engine/arg_utils.py); and a verbatim copy of
  vllm/v1/spec_decode/dynamic/utils.py (self-contained: vLLM's own schedule validation), kept as
  .py.txt so the linters leave vLLM's formatting alone.
- sglang-0.5.23.json: every option ``add_cli_args_from_dataclass`` derives from the fields of
  sglang/srt/arg_groups/fields/*.py (same naming rules: ``--field-name`` or ``cli_name``, plus
  aliases; ``no_cli`` skipped), the ones ``ServerArgs.add_cli_args`` adds by hand, and the
  builtin speculative algorithms (sglang/srt/speculative/spec_info.py).
- llama.cpp-0.3.36.json: every ``add_opt(common_arg(...))`` of common/arg.cpp with its names,
  negations, value count, examples, excludes and whether it is removed (``arg_removed``), and
  the speculative type names of common/speculative.cpp.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "engine_options"


# ------------------------------------------------------------------------------------------
# vLLM


def _literal_strings(node: ast.AST, named: dict[str, ast.AST]) -> list[str]:
    """The strings of a ``Literal[...]`` (nested Literals and names of Literals expanded)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name):
        return _literal_strings(named[node.id], named) if node.id in named else []
    if isinstance(node, ast.Subscript):
        inner = node.slice
        elts = inner.elts if isinstance(inner, ast.Tuple) else [inner]
        return [s for e in elts for s in _literal_strings(e, named)]
    return []


def _module_literals(tree: ast.Module) -> dict[str, ast.AST]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            t = node.targets[0]
            if isinstance(t, ast.Name) and isinstance(node.value, ast.Subscript):
                out[t.id] = node.value
    return out


def extract_vllm(root: Path) -> dict:
    spec_py = root / "vllm/config/speculative.py"
    tree = ast.parse(spec_py.read_text())
    named = _module_literals(tree)
    fields = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "SpeculativeConfig":
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    fields[item.target.id] = ast.unparse(item.annotation)
    kernel = ast.parse((root / "vllm/config/kernel.py").read_text())
    arg_utils = (root / "vllm/engine/arg_utils.py").read_text()
    flags = sorted(set(re.findall(r'add_argument\(\s*"(--[a-z0-9-]+)"', arg_utils)))
    shutil.copyfile(
        root / "vllm/v1/spec_decode/dynamic/utils.py", OUT / "vllm-0.33.0-dynamic-sd-utils.py.txt"
    )
    return {
        "engine": "vllm",
        "release": "vllm 0.33.0 (PyPI wheel)",
        "sources": [
            "vllm/config/speculative.py",
            "vllm/config/kernel.py",
            "vllm/engine/arg_utils.py",
            "vllm/v1/spec_decode/dynamic/utils.py",
        ],
        "speculative_config_fields": fields,
        "speculative_methods": _literal_strings(named["SpeculativeMethod"], named),
        "moe_backends": _literal_strings(_module_literals(kernel)["MoEBackend"], {}),
        "cli_flags": flags,
    }


# ------------------------------------------------------------------------------------------
# SGLang


def _choices_lists(path: Path) -> dict[str, list]:
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


def _sglang_option(name: str, ann: ast.AST, choices_named: dict) -> dict | None:
    """One field as add_cli_args_from_dataclass registers it (None: not a CLI option)."""
    if not (isinstance(ann, ast.Subscript) and getattr(ann.value, "id", None) == "A"):
        return None
    parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
    tp, metas = parts[0], parts[1:]
    meta: dict = {}
    has_meta = False
    for m in metas:
        if isinstance(m, ast.Constant) and isinstance(m.value, str):
            has_meta = True
            break
        if isinstance(m, ast.Call) and getattr(m.func, "id", None) == "Arg":
            has_meta = True
            for kw in m.keywords:
                meta[kw.arg] = kw.value
            break
    if not has_meta:
        return None
    if "no_cli" in meta and ast.literal_eval(meta["no_cli"]) is True:
        return None
    cli = ast.literal_eval(meta["cli_name"]) if "cli_name" in meta else None
    names = [cli or "--" + name.replace("_", "-")]
    if "aliases" in meta:
        names += ast.literal_eval(meta["aliases"])
    tsrc = ast.unparse(tp)
    inner = re.sub(r"^Optional\[(.*)\]$", r"\1", tsrc)
    opt: dict = {"field": name, "names": names, "type": tsrc}
    if "action" in meta:
        opt["kind"] = "action"
        opt["action"] = ast.unparse(meta["action"])
    elif inner.startswith("Literal["):
        opt["kind"] = "value"
        lit = ast.parse(inner, mode="eval").body
        opt["choices"] = [
            ast.literal_eval(e)
            for e in (lit.slice.elts if isinstance(lit.slice, ast.Tuple) else [lit.slice])
        ]
    elif inner.startswith(("list[", "List[")) and "type_parser" not in meta:
        opt["kind"] = "list"
    elif inner == "bool":
        opt["kind"] = "store_true"
    else:
        opt["kind"] = "value"
        opt["value_type"] = inner if inner in ("int", "float", "str") else "str"
    if "choices" in meta and "choices" not in opt:
        c = meta["choices"]
        if isinstance(c, ast.Name):
            opt["choices"] = choices_named.get(c.id, "dynamic")
        else:
            try:
                opt["choices"] = ast.literal_eval(c)
            except ValueError:
                opt["choices"] = "dynamic"
    return opt


def extract_sglang(root: Path) -> dict:
    srt = root / "sglang/srt"
    choices_named = _choices_lists(srt / "arg_groups/choices.py")
    options = []
    files = sorted((srt / "arg_groups/fields").glob("*.py"))
    for path in files:
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    opt = _sglang_option(item.target.id, item.annotation, choices_named)
                    if opt is not None:
                        opt["file"] = str(path.relative_to(root))
                        options.append(opt)
    server_args = (srt / "server_args.py").read_text()
    manual = sorted(set(re.findall(r'parser\.add_argument\(\s*"(--[a-z0-9-]+)"', server_args)))
    spec_info = (srt / "speculative/spec_info.py").read_text()
    enum = re.search(r"class SpeculativeAlgorithm\(Enum\):(.*?)\n    def ", spec_info, re.S)
    algos = re.findall(r"^    ([A-Z0-9_]+) = auto\(\)", enum.group(1), re.M)
    return {
        "engine": "sglang",
        "release": "sglang 0.5.23 (PyPI wheel)",
        "sources": [
            *(str(p.relative_to(root)) for p in files),
            "sglang/srt/arg_groups/arg_utils.py (naming rules)",
            "sglang/srt/server_args.py",
            "sglang/srt/speculative/spec_info.py",
        ],
        "options": options,
        "manual_flags": manual,
        "speculative_algorithms": algos,
    }


# ------------------------------------------------------------------------------------------
# llama.cpp


def _block(text: str, start: int) -> str:
    """The text of the parenthesised call that opens at ``text[start] == '('``."""
    depth, i, n = 0, start, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == "'":
            i += 1
            while text[i] != "'":
                i += 2 if text[i] == "\\" else 1
        elif c == "/" and text[i + 1] == "/":
            i = text.index("\n", i)
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
        i += 1
    raise ValueError("unbalanced")


def extract_llama(root: Path) -> dict:
    arg = (root / "common/arg.cpp").read_text()
    options = []
    for m in re.finditer(r"add_opt\(common_arg\(", arg):
        block = _block(arg, m.start() + len("add_opt"))
        body = re.sub(r"^\s*//[^\n]*\n", "", block[len("(common_arg(") :], flags=re.M)
        groups = re.match(r"\s*\{([^{}]*)\}\s*,\s*(\{([^{}]*)\}\s*,)?", body)
        names = re.findall(r'"([^"]+)"', groups.group(1))
        neg = re.findall(r'"([^"]+)"', groups.group(3)) if groups.group(2) else []
        lam = re.search(r"\[\]\s*\(([^)]*)\)", body)
        params = [p.strip() for p in lam.group(1).split(",")] if lam else []
        if len(params) <= 1:
            values = 0
        elif len(params) == 2 and re.match(r"bool\b", params[1]):
            values = 0
        else:
            values = len(params) - 1
        ex = re.search(r"\.set_examples\(\{([^}]*)\}\)", block)
        excl = re.search(r"\.set_excludes\(\{([^}]*)\}\)", block)
        env = re.search(r'\.set_env\("([^"]+)"\)', block)
        options.append(
            {
                "names": names,
                "negations": neg,
                "values": values,
                "examples": re.findall(r"LLAMA_EXAMPLE_\w+", ex.group(1))
                if ex
                else ["LLAMA_EXAMPLE_COMMON"],
                "excludes": re.findall(r"LLAMA_EXAMPLE_\w+", excl.group(1)) if excl else [],
                "env": env.group(1) if env else None,
                "removed": "arg_removed(" in block,
            }
        )
    spec = (root / "common/speculative.cpp").read_text()
    types = re.findall(r'\{"([a-z0-9-]+)",\s+COMMON_SPECULATIVE_TYPE_\w+\}', spec)
    return {
        "engine": "llama.cpp",
        "release": "llama.cpp as vendored in llama-cpp-python 0.3.36 "
        "(vendor/llama.cpp, commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f)",
        "sources": ["common/arg.cpp", "common/speculative.cpp"],
        "options": options,
        "speculative_types": types,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm", type=Path, required=True, help="folder holding the vllm/ package")
    p.add_argument("--sglang", type=Path, required=True, help="folder holding the sglang/ package")
    p.add_argument("--llama-cpp", type=Path, required=True, help="the llama.cpp source folder")
    a = p.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for name, data in (
        ("vllm-0.33.0.json", extract_vllm(a.vllm)),
        ("sglang-0.5.23.json", extract_sglang(a.sglang)),
        ("llama.cpp-0.3.36.json", extract_llama(a.llama_cpp)),
    ):
        (OUT / name).write_text(json.dumps(data, indent=1) + "\n")
        print(OUT / name)


if __name__ == "__main__":
    main()
