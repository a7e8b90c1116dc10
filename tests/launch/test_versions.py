"""Scripts for the Megatron-LM release the user runs: its table, its names, its defaults, its refusals."""

from __future__ import annotations

import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from megapilot.errors import MegapilotError
from megapilot.launch import LaunchOptions, render_launch
from megapilot.launch.flags import ArgSection
from megapilot.launch.megatron_args import SCRIPT_RELEASE_NAMES, committed_releases, flag_table, parse_version
from megapilot.launch.versions import adapt_sections, renamed_flag, resolve_flag_table, target_release
from megapilot.spec import TrainingSpec
from tests.launch.plans import LLAMA31_8B, make_plan
from tests.launch.variants import OPTION_VARIANTS, PAIRED_VARIANTS, VARIANT_PLANS

SOURCES = Path(__file__).parent / "data" / "megatron_sources"
_TRAIN = TrainingSpec(seq_length=4096, global_batch_size=64)


def _every_variant() -> list[tuple[str, object, LaunchOptions]]:
    pairs = [(f"{p}/{o}", VARIANT_PLANS[p], OPTION_VARIANTS[o]) for p in sorted(VARIANT_PLANS)
             for o in sorted(OPTION_VARIANTS)]
    return pairs + [(f"paired{i}", plan, options) for i, (plan, options) in enumerate(PAIRED_VARIANTS)]


@pytest.mark.parametrize("release", committed_releases())
def test_every_flag_a_script_emits_for_a_release_is_in_its_table(release: str) -> None:
    """Each variant renders for the release with only that release's flags, or is refused naming the newer
    release that has what it needs."""
    table = flag_table(release)
    rendered = refused = 0
    for name, plan, options in _every_variant():
        try:
            launch = render_launch(plan, options.model_copy(update={"megatron_version": release}))
        except MegapilotError as error:
            if error.field != "megatron_version":
                continue  # refused for a reason of its own (as for every release): not this test's subject
            needed = [r for r in committed_releases() if r in str(error) and parse_version(r) > table.version]
            assert needed, f"{name}: {error}"
            refused += 1
            continue
        flags = [a for a in launch.megatron_args if a.startswith("--") and a[2:3].isalpha()]
        assert set(flags) <= table.flags.keys(), name
        assert f"Flags checked against Megatron-LM {release}." in launch.script
        rendered += 1
    assert rendered >= 10
    if release == committed_releases()[-1]:
        assert refused == 0


def test_nvfp4_is_refused_for_014_naming_015() -> None:
    plan = make_plan(LLAMA31_8B, "b200", 1, _TRAIN.model_copy(update={"precision": "nvfp4"}), tp=2)
    options = OPTION_VARIANTS["mock"]
    with pytest.raises(MegapilotError, match=r"added in Megatron-LM core_v0.15.0") as info:
        render_launch(plan, options.model_copy(update={"megatron_version": "0.14"}))
    assert info.value.field == "megatron_version"
    script = render_launch(plan, options.model_copy(update={"megatron_version": "0.15"}))
    assert "--fp4-format" in script.megatron_args


def test_a_renamed_flag_is_written_under_the_chosen_releases_name() -> None:
    """--no-tp-comm-overlap-ag (core_v0.16.0 on) was --disable-tp-comm-overlap-ag: same dest, same action."""
    assert renamed_flag("--no-tp-comm-overlap-ag", flag_table("0.14")) == "--disable-tp-comm-overlap-ag"
    assert renamed_flag("--disable-ckpt-fully-parallel-save", flag_table("0.19")) == "--no-ckpt-fully-parallel-save"
    assert renamed_flag("--moe-shared-expert-gate", flag_table("0.14")) is None
    sections = [ArgSection("training", ["--no-tp-comm-overlap-ag", "--train-iters", "10"])]
    notes = adapt_sections(sections, flag_table("0.15"))
    assert sections[0].args[0] == "--disable-tp-comm-overlap-ag"
    assert any("spelled --disable-tp-comm-overlap-ag in Megatron-LM core_v0.15.0" in n for n in notes)
    flag_table("0.15").split_args(sections[0].args)


@pytest.mark.parametrize(("release", "written"), [("0.14", False), ("0.15", False), ("0.16", True), ("0.19", True)])
def test_eval_interval_is_written_where_its_default_became_none(release: str, written: bool) -> None:
    launch = render_launch(VARIANT_PLANS[sorted(VARIANT_PLANS)[0]],
                           OPTION_VARIANTS["mock"].model_copy(update={"megatron_version": release}))
    assert ("--eval-interval" in launch.megatron_args) is written
    if written:
        assert launch.megatron_args[launch.megatron_args.index("--eval-interval") + 1] == "1000"
        assert any("--eval-interval 1000 written out" in n for n in launch.notes)


def _local_checkout(release: str, tmp_path: Path) -> Path:
    root = tmp_path / "Megatron-LM"
    with tarfile.open(SOURCES / f"{release}.tar.xz") as archive:
        archive.extractall(root, filter="data")
    (root / "pretrain_gpt.py").write_text("")
    return root


def test_a_local_checkout_decides_the_release_from_its_own_source(tmp_path: Path) -> None:
    root = _local_checkout("core_v0.14.0", tmp_path)
    options = OPTION_VARIANTS["mock"].model_copy(update={"megatron_path": str(root)})
    table = resolve_flag_table(options)
    assert table.release == "core_v0.14.0" and table.commit is None
    assert f"Megatron-LM core_v0.14.0 ({root}/megatron/training/arguments.py)" in render_launch(
        VARIANT_PLANS[sorted(VARIANT_PLANS)[0]], options).script
    with pytest.raises(MegapilotError, match=r"the checkout at .* is 0.14.0") as info:
        resolve_flag_table(options.model_copy(update={"megatron_version": "0.16"}))
    assert info.value.field == "megatron_version"


def test_errors_about_the_checkout_are_worded_by_the_command(tmp_path: Path) -> None:
    """A checkout of another release, or no checkout at all, is refused naming how the command took the release and
    the checkout: `megapilot script`'s options, or what the caller passes (a suite's config keys)."""
    names = replace(SCRIPT_RELEASE_NAMES, version="tool.version", path="tool.checkout")
    checkout = _local_checkout("core_v0.14.0", tmp_path)
    options = OPTION_VARIANTS["mock"].model_copy(update={"megatron_path": str(checkout), "megatron_version": "0.16"})
    with pytest.raises(MegapilotError) as script:
        resolve_flag_table(options)
    assert script.value.problem.startswith("--megatron-version 0.16 but the checkout at ")
    assert script.value.fix == "drop --megatron-version (the checkout decides) or point --megatron-path at the right " \
                               "checkout"
    with pytest.raises(MegapilotError) as worded:
        resolve_flag_table(options, names)
    assert worded.value.problem.startswith("tool.version 0.16 but the checkout at ")
    assert worded.value.fix == "drop tool.version (the checkout decides) or point tool.checkout at the right checkout"
    broken = tmp_path / "broken"
    (broken / "megatron/training").mkdir(parents=True)
    (broken / "megatron/training/arguments.py").write_text("")  # no package_info.py: not a release's checkout
    with pytest.raises(MegapilotError) as info:
        resolve_flag_table(options.model_copy(update={"megatron_path": str(broken)}), names)
    assert (info.value.field, info.value.fix) == ("megatron_path", "point tool.checkout at the root of a Megatron-LM "
                                                                   "checkout")
    (broken / "megatron/core").mkdir()
    (broken / "megatron/core/package_info.py").write_text("MAJOR = 0\nMINOR = 16\nPATCH = 0\n")
    with pytest.raises(MegapilotError, match="has no add_megatron_arguments") as info:
        resolve_flag_table(options.model_copy(update={"megatron_path": str(broken)}), names)
    assert info.value.fix == "point tool.checkout at a Megatron-LM checkout (core_v0.14.0 or newer)"


def test_a_remote_checkout_path_uses_the_chosen_table(tmp_path: Path) -> None:
    root = _local_checkout("core_v0.14.0", tmp_path)
    options = OPTION_VARIANTS["mock"].model_copy(update={"megatron_path": str(root), "remote": True,
                                                         "megatron_version": "0.17"})
    assert resolve_flag_table(options).release == "core_v0.17.0"


def test_the_release_a_script_runs_keeps_the_patch_asked_for(tmp_path: Path) -> None:
    """A patch release shares its minor's table but may change what the code does with a flag (0.16.1's hybrid
    stack reads the uneven-split flags): the release the script is for keeps the patch asked for, the checkout's
    own version where one is read, else the newest table's."""
    mock = OPTION_VARIANTS["mock"]
    for asked, release in (("0.16.1", (0, 16, 1)), ("core_v0.16.0", (0, 16, 0)), ("0.17", (0, 17, 0))):
        options = mock.model_copy(update={"megatron_version": asked})
        assert target_release(options, resolve_flag_table(options)) == release
    assert target_release(mock, resolve_flag_table(mock)) == flag_table().version
    checkout = mock.model_copy(update={"megatron_path": str(_local_checkout("core_v0.14.0", tmp_path))})
    assert target_release(checkout, resolve_flag_table(checkout)) == (0, 14, 0)
