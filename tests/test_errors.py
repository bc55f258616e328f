"""Every bad input: one line on stderr naming the problem, a non-zero exit, never a traceback."""

from __future__ import annotations

import pytest

from paramscope.cli import main

from conftest import bert_config


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(capsys, argv, *expected):
    code, out, err = run_cli(capsys, *argv)
    assert code != 0
    assert out == ""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("paramscope: error: ")
    for fragment in expected:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def test_missing_file(capsys):
    assert_one_line_error(capsys, ["inspect", "nowhere/config.json"], "no such file or directory", "nowhere/config.json")


def test_malformed_json(capsys, write_config):
    path = write_config('{"model_type": "bert", ')
    assert_one_line_error(capsys, ["inspect", str(path)], "malformed JSON", str(path), "line 1")


def test_config_not_an_object(capsys, write_config):
    path = write_config("[1, 2, 3]")
    assert_one_line_error(capsys, ["inspect", str(path)], "expected a JSON object, got list")


def test_missing_model_type(capsys, write_config):
    config = bert_config()
    del config["model_type"]
    assert_one_line_error(capsys, ["inspect", str(write_config(config))], "no 'model_type'")


def test_unknown_model_type(capsys, write_config):
    path = write_config(bert_config(model_type="bertish"))
    assert_one_line_error(capsys, ["inspect", str(path)], "unknown model_type 'bertish'")


def test_remote_code_is_refused_without_the_flag(capsys, write_config):
    path = write_config(bert_config(model_type="my_custom", auto_map={"AutoModel": "modeling_x.MyModel"}))
    assert_one_line_error(capsys, ["inspect", str(path)], "'my_custom'", "--trust-remote-code")


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("hidden_size", "wide", "'hidden_size' must be an integer, got 'wide'"),
        ("num_hidden_layers", 1.5, "'num_hidden_layers' must be an integer, got 1.5"),
        ("vocab_size", True, "'vocab_size' must be an integer, got True"),
        ("hidden_size", 0, "'hidden_size' must be positive, got 0"),
        ("num_attention_heads", -4, "'num_attention_heads' must be positive, got -4"),
        ("type_vocab_size", -1, "'type_vocab_size' must be a non-negative integer, got -1"),
        ("hidden_size", 770, "hidden_size 770 is not divisible by num_attention_heads 12"),
    ],
)
def test_bad_field_values(capsys, write_config, field, value, fragment):
    path = write_config(bert_config(**{field: value}))
    assert_one_line_error(capsys, ["inspect", str(path)], fragment)


def test_wrong_type_caught_by_transformers_validation(capsys, write_config):
    path = write_config(bert_config(layer_norm_eps="tiny"))
    assert_one_line_error(capsys, ["inspect", str(path)], "invalid bert config", "layer_norm_eps")


def test_unknown_class(capsys):
    assert_one_line_error(capsys, ["inspect", "bert-base-uncased", "--class", "BertForMagic"],
                          "unknown class 'BertForMagic'")


def test_class_that_does_not_fit_the_model_type(capsys):
    assert_one_line_error(capsys, ["inspect", "bert-base-uncased", "--class", "GPT2LMHeadModel"],
                          "GPT2LMHeadModel is for model_type 'gpt2'", "'bert'")


def test_unknown_task(capsys):
    assert_one_line_error(capsys, ["inspect", "bert-base-uncased", "--task", "telepathy"], "unknown task 'telepathy'")


def test_task_without_a_class_for_this_model(capsys):
    assert_one_line_error(capsys, ["inspect", "bert-base-uncased", "--task", "text2text-generation"],
                          "has no class for model_type 'bert'")


def test_bad_num_labels(capsys):
    assert_one_line_error(capsys, ["inspect", "bert-base-uncased", "--task", "ner", "--num-labels", "0"],
                          "--num-labels must be a positive integer, got 0")


def test_hub_id_offline_with_nothing_cached(capsys, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert_one_line_error(capsys, ["inspect", "nobody/nothing"], "hub id nobody/nothing", "HF_HUB_OFFLINE",
                          "not in the local cache")


def test_unknown_preset_name(capsys):
    assert_one_line_error(capsys, ["inspect", "bert-huge"], "unknown model 'bert-huge'")


def test_debug_shows_the_traceback(capsys, write_config):
    from paramscope import ConfigError

    path = write_config(bert_config(hidden_size=770))
    with pytest.raises(ConfigError):
        main(["--debug", "inspect", str(path)])
    with pytest.raises(ConfigError):
        main(["inspect", str(path), "--debug"])


def test_one_error_family_every_public_error_exported_from_errors_py():
    import ast
    from pathlib import Path

    import paramscope
    from paramscope import errors

    public = {name for name, value in vars(errors).items()
              if isinstance(value, type) and issubclass(value, errors.ParamscopeError)}
    assert public >= {"ParamscopeError", "SourceError", "ConfigError", "ModelClassError", "RemoteCodeError",
                      "CheckpointError", "OptionError", "UnsupportedError", "FormulaError", "FormulaMismatchError",
                      "AssumptionError", "TemplateError"}
    for name in public:  # exported, and the same class wherever it is imported from
        assert getattr(paramscope, name) is getattr(errors, name), name
        assert name in paramscope.__all__ and name in errors.__all__, name
    # no ParamscopeError subclass is defined anywhere else in the package
    package = Path(paramscope.__file__).parent
    for path in package.rglob("*.py"):
        if path.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = {getattr(b, "id", getattr(b, "attr", None)) for b in node.bases}
                assert not bases & public, f"{path.relative_to(package)} defines {node.name}({bases & public})"


def test_library_messages_name_parameters_and_the_cli_spells_flags(capsys):
    import paramscope
    from paramscope.errors import OptionError

    with pytest.raises(OptionError) as caught:
        paramscope.estimate_memory("gpt2", paramscope.MemoryOptions(batch=0))
    assert str(caught.value) == "batch must be between 1 and 1,048,576, got 0"
    assert caught.value.options == ("batch",)
    with pytest.raises(paramscope.ModelClassError, match="^give model_class or task, not both$"):
        paramscope.inspect("bert-base-uncased", model_class="BertModel", task="ner")
    assert main(["memory", "gpt2", "--batch", "0"]) == 2
    assert capsys.readouterr().err == "paramscope: error: --batch must be between 1 and 1,048,576, got 0\n"
    assert main(["inspect", "bert-base-uncased", "--class", "BertModel", "--task", "ner"]) == 2
    assert capsys.readouterr().err == "paramscope: error: give --class or --task, not both\n"
    # a value taken from a file never reaches the format string
    err = OptionError("{0} {text!r} matches nothing", "train", text="{0}{oops}")
    assert str(err) == "train '{0}{oops}' matches nothing"
    assert err.spelled(lambda option: "--" + option) == "--train '{0}{oops}' matches nothing"


def test_no_library_message_names_a_cli_flag():
    """Library errors speak of parameters; only cli/ spells flags (a template's {0} is spelled by the CLI)."""
    import ast
    import re
    from pathlib import Path

    import paramscope

    package = Path(paramscope.__file__).parent
    offenders = []
    for path in package.rglob("*.py"):
        if "cli" in path.relative_to(package).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
                first = node.exc.args[0]
                parts = first.values if isinstance(first, ast.JoinedStr) else [first]
                text = "".join(p.value for p in parts if isinstance(p, ast.Constant) and isinstance(p.value, str))
                if re.search(r"(?<![\w-])--[a-z]", text):
                    offenders.append(f"{path.relative_to(package)}:{node.lineno}")
    assert not offenders, offenders


def _locked_folder(tmp_path, monkeypatch):
    """A folder whose entries cannot be reached, as without its execute bit: root is never refused, so the refusal
    is simulated (os.stat and os.open raise what the kernel raises for anyone else)."""
    import json
    import os

    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "config.json").write_text(json.dumps(bert_config()))
    inside = str(locked) + os.sep
    real_stat, real_open = os.stat, os.open

    def stat(path, *args, **kwargs):
        if os.fspath(path).startswith(inside):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_stat(path, *args, **kwargs)

    def open_(path, *args, **kwargs):
        if os.fspath(path).startswith(inside):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "open", open_)
    return locked


def test_a_config_in_a_folder_without_permission(capsys, tmp_path, monkeypatch):
    locked = _locked_folder(tmp_path, monkeypatch)
    config = str(locked / "config.json")
    line = assert_one_line_error(capsys, ["inspect", config], "permission denied", config)
    assert "internal error" not in line
    assert_one_line_error(capsys, ["inspect", str(locked)], "permission denied", config)
    assert_one_line_error(capsys, ["memory", str(locked)], "permission denied", config)


def test_an_unreadable_config_file(capsys, tmp_path, monkeypatch):
    import os

    path = tmp_path / "config.json"
    path.write_text("{}")
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda p, *a, **k: (_ for _ in ()).throw(PermissionError(13, "Permission denied"))
                        if os.fspath(p) == str(path) else real_open(p, *a, **k))
    assert_one_line_error(capsys, ["inspect", str(path)], f"permission denied: cannot open config file {path}")


@pytest.mark.parametrize("debug", [False, True])
def test_a_recording_that_fails_is_silent_unless_debug(capsys, monkeypatch, write_config, debug):
    """The answer is out before the template is recorded: a failed recording never fails the command, and says
    nothing, except under --debug, where what was swallowed is shown (type, message and traceback)."""
    from paramscope import template, template_record
    from paramscope.cli import _recording as recording

    def no_template(config, **options):
        return template.TemplateLookup(None, why_not="no template (test)")

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setenv(recording.RECORD_ENV, "wait")
    monkeypatch.setattr(template, "lookup_template", no_template)  # the build answers, and a template is due
    monkeypatch.setattr(template_record, "record_template", disk_full)
    path = write_config(bert_config(num_hidden_layers=2))
    argv = ["inspect", str(path), "--no-tree"] + (["--debug"] if debug else [])
    code, out, err = run_cli(capsys, *argv)
    assert code == 0 and "BertForMaskedLM" in out  # the answer, whatever the recording did
    if not debug:
        assert err == ""
        return
    assert err, "--debug must show what the recording's fallback swallowed"
    first = err.splitlines()[0]
    assert first.startswith("paramscope: debug: nothing recorded after the build (OSError: ")
    assert "No space left on device" in first
    assert "Traceback (most recent call last)" in err and "disk_full" in err


def test_a_window_of_zero_is_no_window_only_where_transformers_reads_it_so(write_config, capsys):
    """Beside use_sliding_window false (Qwen2-MoE's own default writes 0 there) sliding_window 0 is no window:
    accepted, and named. Elsewhere transformers builds a window of 0 tokens, whose mask hides every key (Mistral's
    forward fails on it): refused in one line."""
    config = write_config({"model_type": "qwen2_moe", "num_hidden_layers": 2, "sliding_window": 0,
                           "use_sliding_window": False})
    assert main(["inspect", str(config)]) == 0
    assert "sliding_window=0: no window, as transformers reads it; every layer attends to every token" \
        in " ".join(capsys.readouterr().out.split())
    config = write_config({"model_type": "mistral", "num_hidden_layers": 2, "sliding_window": 0})
    assert_one_line_error(capsys, ["inspect", str(config)], "config field 'sliding_window' is 0, a window of no "
                                                             "tokens")


def test_an_estimate_given_an_option_beside_its_options_names_where_it_belongs():
    """`estimate_memory("gpt2", dtype=...)` was a TypeError from deep in the engines: now one OptionError naming
    the options class that takes it, before any work; an unknown keyword names what the function takes."""
    import paramscope
    from paramscope import OptionError

    for function, options, keyword in ((paramscope.estimate_memory, "MemoryOptions", "dtype"),
                                       (paramscope.estimate_training, "TrainingOptions", "batch"),
                                       (paramscope.estimate_flops, "FlopOptions", "seq"),
                                       (paramscope.estimate_serving, "ServeOptions", "gpu")):
        args = (paramscope.ServeOptions(gpu="h100"),) if function is paramscope.estimate_serving else ()
        with pytest.raises(OptionError, match=rf"takes {keyword} in its options: options={options}\({keyword}=\.\.\.\)"):
            function("gpt2", *args, **{keyword: 1})
        with pytest.raises(OptionError, match=r"has no argument 'bogus': .* model_class, task, num_labels"):
            function("gpt2", *args, bogus=1)
