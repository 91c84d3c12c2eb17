"""mypy --strict accepts every compat example in each form: as written against
stormguard, rewritten onto stormguard's own ``Client`` and onto openai-python's clients
over stormguard's transport (forms.py), and openai 3.x's clients taking stormguard's HTTP
clients natively (typed_http_client.py). One mypy run checks them all."""

from __future__ import annotations

from pathlib import Path

import pytest
from mypy import api as mypy_api

from tests.compat.forms import EXAMPLES, FORMS, example_names

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_strict_accepts_every_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = [str(EXAMPLES / f"{name}.py") for name in example_names()]
    files.append(str(Path(__file__).with_name("typed_http_client.py")))
    for form in FORMS:
        if form.module is None:
            continue  # the examples as written, above
        for name in example_names():
            rewritten = tmp_path / f"{form.name}_{name}.py"
            rewritten.write_text(form.source(name))
            files.append(str(rewritten))
    monkeypatch.chdir(ROOT)  # the rewritten files import tests.compat from here
    out, err, status = mypy_api.run(["--strict", "--no-error-summary", *files])
    assert status == 0, out + err
