"""Seeds are 32-bit, one range (``engine.config.SEED_END``) for the CLI, the Launch form,
diagnoses and the README: ``jax.random.key`` keeps only a seed's low 32 bits, so a larger
seed would train another seed's run under its own number."""

import re
from pathlib import Path

import jax
import numpy as np
import pytest

from engine.cli.main import main
from engine.config import SEED_END, ConfigError, RunConfig, parse_seeds, sweep_from_flat, to_flat

README = Path(__file__).resolve().parents[2] / "README.md"


def test_a_seed_past_32_bits_would_be_another_seed():
    assert SEED_END == 2**32
    same = jax.random.key_data(jax.random.key(SEED_END + 5)), jax.random.key_data(jax.random.key(5))
    assert np.array_equal(*same)  # why the range stops at 2**32
    assert not np.array_equal(jax.random.key_data(jax.random.key(SEED_END - 1)), jax.random.key_data(jax.random.key(0)))


def test_cli_form_and_config_accept_exactly_the_32_bit_seeds():
    assert parse_seeds(f"0,{SEED_END - 1}") == [0, SEED_END - 1]
    assert RunConfig(seed=SEED_END - 1).seed == SEED_END - 1
    for refused in (lambda: parse_seeds(str(SEED_END)), lambda: RunConfig(seed=SEED_END),
                    lambda: sweep_from_flat({**to_flat(RunConfig()), "estimators": "basis", "ranks": "8", "lams": "0",
                                                                  "seeds": f"{SEED_END - 2}-{SEED_END}"})):
        with pytest.raises(ConfigError, match=f"seed must be an integer in \\[0, {SEED_END}\\)"):
            refused()


def test_the_cli_refuses_a_64_bit_seed_in_one_line(capsys, tmp_path):
    code = main(["run", "--db", str(tmp_path / "lab.db"), "--preset", "tiny", "--seed", str(2**40), "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"[0, {SEED_END})" in err
    assert not (tmp_path / "lab.db").exists()


def test_the_readme_gives_the_same_range():
    text = " ".join(README.read_text().split())
    assert f"{SEED_END - 1:,}" in text and "Seeds are 32-bit" in text
    sentence = next(s for s in re.split(r"(?<=\.) ", text) if "64-bit integers" in s)
    assert "seed" not in sentence.lower()
