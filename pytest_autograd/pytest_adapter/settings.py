"""Command-line options and their ini twins, validated without importing torch."""

from dataclasses import dataclass

import pytest

from pytest_autograd.engine import devices
from pytest_autograd.engine.devices import split_names
from pytest_autograd.engine.isolate_modes import ISOLATE_HELP, ISOLATE_MODES, isolate_problem
from pytest_autograd.engine.outcomes import UsageProblem

OPTIONS = {
    # name: (help, ini default)
    "devices": ("comma-separated devices to check on, e.g. cpu,cuda (default: cpu; CPU is the ground truth "
                "for parity)", "cpu"),
    "checks": ("comma-separated checks to run (default: every default-on check that applies; opt-in checks "
               "such as compile and bench run only when named here or in checks= on the marker)", ""),
    "seed": ("base seed; each item derives its own from it (default 0, or 'random')", "0"),
    "isolate": (ISOLATE_HELP, ISOLATE_MODES[0]),
}


REQUIRE_DEVICES = "autograd_require_devices"
REQUIRE_DEVICES_HELP = ("make a device asked for but absent (no CUDA on this machine) an error instead of skipping its "
                        "items, e.g. for a GPU CI job")


def add_options(parser):
    group = parser.getgroup("autograd", "autograd op checks (pytest-autograd)")
    for name, (help_text, default) in OPTIONS.items():
        group.addoption(f"--autograd-{name}", dest=f"autograd_{name}", default=None,
                        help=f"{help_text}. ini: autograd_{name}")
        _add_ini(parser, f"autograd_{name}", help_text, default)
    group.addoption("--autograd-require-devices", dest=REQUIRE_DEVICES, action="store_true", default=None,
                    help=f"{REQUIRE_DEVICES_HELP}. ini: {REQUIRE_DEVICES}")
    parser.addini(REQUIRE_DEVICES, REQUIRE_DEVICES_HELP, type="bool", default=False)


def _add_ini(parser, name, help_text, default):
    """Declare the ini twin with a type that accepts pytest 9's native ``[tool.pytest]`` values.

    Devices and checks are lists ("args": a TOML list of strings, or an ini
    string split as in a shell, commas allowed); the seed is an int or the
    string 'random'.
    """
    if name == "autograd_seed":
        add_number_ini(parser, name, help_text, default, int)
        return
    parser.addini(name, help_text, type="args", default=split_names(default))


def add_number_ini(parser, name, help_text, default, number_type):
    """An ini value that is a number or text, declared in the richest form this pytest accepts.

    pytest 9.2 takes a union (a TOML number or a word such as 'random');
    8.4 to 9.1 take "int"/"float" (a TOML number or its text, no words);
    older ones take text only. Anything else raises AssertionError at start-up
    on those versions, which would break every run in the environment.
    """
    version = tuple(getattr(pytest, "version_tuple", (0,))[:2])
    if version >= (9, 2):
        from typing import Union

        parser.addini(name, help_text, type=Union[number_type, str], default=default)
    elif version >= (8, 4) and number_type is float:
        parser.addini(name, help_text, type="float", default=float(default))
    else:
        parser.addini(name, help_text, default=str(default))


def option_value(config, name):
    """``--autograd-NAME``, else ini ``autograd_NAME``, as a stripped string (lists joined by commas)."""
    value = config.getoption(f"autograd_{name}")
    if value is None:
        value = _getini(config, f"autograd_{name}")
    if isinstance(value, (list, tuple)):
        return ",".join(str(part) for part in value)
    return str(value).strip()


def _getini(config, name):
    """``config.getini``, also for a TOML number given to a text option.

    pytest 9.0 and 9.1 read native ``[tool.pytest]`` tables but declare no
    number-or-text type: ``autograd_seed = 7`` there raises TypeError in
    getini, so the value is read as written.
    """
    try:
        return config.getini(name)
    except TypeError:
        raw = getattr(config, "_inicfg", {}).get(name)
        if raw is None:
            raise
        return getattr(raw, "value", raw)


def parse_devices(text, source):
    """``--autograd-devices`` (or its ini twin) as a list of names; a usage error names the mistake."""
    try:
        return devices.parse_devices(text, source)
    except UsageProblem as problem:
        raise pytest.UsageError(str(problem)) from None


def _parse_seed(text):
    if text == "random":
        from pytest_autograd.engine.seeding import draw_random_seed

        return draw_random_seed()
    try:
        return int(text)
    except ValueError:
        raise pytest.UsageError(
            f"--autograd-seed: {text!r} is not an integer; pass e.g. --autograd-seed=1234 or 'random'"
        ) from None


WORKER_INPUT_KEY = "autograd_seed"


def base_seed_from_controller(config):
    """The seed the xdist controller chose, on a worker; None elsewhere.

    ``--autograd-seed=random`` is drawn once, on the xdist controller when there
    is one, and handed to every worker, so all workers use the header's seed.
    """
    workerinput = getattr(config, "workerinput", None)
    if isinstance(workerinput, dict) and WORKER_INPUT_KEY in workerinput:
        return int(workerinput[WORKER_INPUT_KEY])
    return None


@dataclass
class Settings:
    devices: list
    checks: list  # None: every registered check
    seed: int
    require_devices: bool = False  # an absent device is an error, not a skip
    isolate: str = ISOLATE_MODES[0]  # engine.exploration: where a crash of the op cannot end the session

    @classmethod
    def from_config(cls, config):
        devices = parse_devices(option_value(config, "devices"), "--autograd-devices")
        checks = split_names(option_value(config, "checks")) or None
        seed = base_seed_from_controller(config)
        if seed is None:
            seed = _parse_seed(option_value(config, "seed"))
        require = config.getoption(REQUIRE_DEVICES, None)
        if require is None:
            require = bool(config.getini(REQUIRE_DEVICES))
        isolate = option_value(config, "isolate") or ISOLATE_MODES[0]
        problem = isolate_problem(isolate, "--autograd-isolate")
        if problem:
            raise pytest.UsageError(problem)
        return cls(devices=devices, checks=checks, seed=seed, require_devices=require, isolate=isolate)

    def validate_devices_exist(self):
        """Under --autograd-require-devices, a usage error for the first configured device absent here."""
        if not self.require_devices:
            return
        from pytest_autograd.engine.devices import (
            device_problem,  # imports torch: only when asked to look
        )

        for device in self.devices:
            problem = device_problem(device)
            if problem:
                raise pytest.UsageError(f"--autograd-require-devices: {problem}; run on a machine that has it, or "
                                        "drop it from --autograd-devices")

    def validate_checks(self, known, before_collection=False):
        if self.checks is None:
            return
        unknown = [name for name in self.checks if name not in known]
        if unknown:
            from pytest_autograd.results.naming import did_you_mean

            raise pytest.UsageError(
                f"--autograd-checks: unknown check(s) {', '.join(map(repr, unknown))}{did_you_mean(unknown, known)}; "
                f"known checks are: {', '.join(known)}. "
                + ("Under pytest-xdist the names are checked before collection, so only checks of plugins and of "
                   "the conftest.py files loaded at start-up (the rootdir's, those of the paths given) can be named"
                   if before_collection else
                   "A check registered in a conftest.py applies to the tests in that directory and below: name it "
                   "only when running tests there") + "."
            )
