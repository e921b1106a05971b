"""paper_table's check of a row's partial eval directory when the row's ``--model`` is not (or no longer) a HF model
directory: the line the row's eval gives, not a traceback from reading its config.json."""

import json
import os
import shutil

import pytest

from phf_megatron.errors import UserError
from phf_megatron.tools import paper_rows, paper_table

from .test_paper_table_inputs import _fake_model, _partial_eval


def _eval_line(row) -> str:
    """The line the row's own eval command gives on its directory."""
    from phf_megatron.cli import Settings
    from phf_megatron.eval.config import EvalConfig
    from phf_megatron.eval.runner import run_eval

    settings = Settings(EvalConfig)
    with pytest.raises(UserError) as err:
        run_eval(settings.build(settings.parse(paper_rows.eval_settings(row.eval[3:]))))
    return err.value.line


@pytest.mark.parametrize("row_name,what", [("base", "model"), ("sft", "base model")])
def test_a_rows_model_without_config_json_is_the_evals_one_line(tmp_path, capsys, row_name, what):
    """A --model without config.json (or gone) and samples to resume: _sample_refusals' planned fingerprint read its
    config.json, a FileNotFoundError traceback; a damaged one an AttributeError (the table checks --hf_model's
    config.json is there, not what it holds). Now the eval's line (--model, or the file)."""
    from phf_megatron.eval.models import merged_model_dir

    hf, out = _fake_model(tmp_path), str(tmp_path / "t")
    argv = ["--hf_model", hf, "--scale", "4b", "--out", out, "--rows", row_name]
    row = paper_table.plan_row(paper_table.parse_args(argv), row_name)
    eval_dir = os.path.dirname(row.eval_result)
    _partial_eval(eval_dir, merged_model_dir(eval_dir) if row.adapter else hf, None, adapter=row.adapter)
    config = os.path.join(hf, "config.json")
    with open(config, "w") as f:   # damaged, though JSON: the whole table, from its start
        json.dump([1, 2], f)
    assert paper_table.main(argv) == 2
    assert capsys.readouterr().err == f"error: {config}: expected a JSON object\n"
    assert _eval_line(row) == f"{config}: expected a JSON object"
    for gone, line in ((lambda: os.remove(config), f"--model: {hf} has no config.json (not a HF {what} directory)"),
                       (lambda: shutil.rmtree(hf), f"--model: {hf} does not exist")):
        gone()
        assert _eval_line(row) == line
        with pytest.raises(UserError) as err:
            paper_rows.check_eval_dirs([row], 12, False, 100)
        assert err.value.line == line
