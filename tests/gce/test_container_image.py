"""The images of `node-fencer serve`: handler/Dockerfile and .dockerignore, read as Docker
reads them (dockerfile-parse, ARG defaults or the given build arguments substituted), held to
the workspace they build. One Dockerfile, two images: Cloud Run's by default, the
on-premises one with the build argument infra/onprem/README.md gives.

No Docker daemon or registry is reachable where these run, so the image is not built
here; what can be decided from the files is:

- two stages at least, the last from distroless' cc image for Debian 12 as `nonroot`
  (glibc, CA certificates, no shell), run as that user, port 8080 exposed;
- one `cargo build` in a build stage, with `--release --locked`, the `node-fencer`
  package alone, exactly the features of the image (`serve` and `google-cloud` for Cloud
  Run, `serve` and `redfish` on-premises) and the `node-fencer` binary;
- the build stage's Rust on Debian bookworm (the glibc of debian12), not older than the
  workspace's `rust-version`;
- the final stage copies exactly the path that build writes and runs it with `serve`:
  `ENTRYPOINT ["<that file>"]`, `CMD ["serve"]`, both in exec form (there is no shell to
  run a string). `serve` is CMD because Cloud Run's `args` replace CMD, and the Terraform
  module (infra/modules/node-fencer-gcp) passes `args = ["serve"]` and no `command`: what
  Cloud Run runs, ENTRYPOINT + those args, must be `<that file> serve` as well;
- `.dockerignore` keeps `target/` and the local stack's state out of the context.

Beside it, the Lambda zip (`make package`) is built for the `node-fencer` package alone and
with none of those features. Every check is also run on a planted mistake and must report it.
"""

from __future__ import annotations

import io
import json
import posixpath
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
from dockerfile_parse import DockerfileParser

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "handler" / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
MAKEFILE = REPO / "Makefile"
CLOUD_RUN_MODULE = REPO / "infra" / "modules" / "node-fencer-gcp" / "main.tf"
ONPREM_README = REPO / "infra" / "onprem" / "README.md"
PACKAGE = "node-fencer"
BIN = "node-fencer"
CLOUD_RUN_FEATURES = {"serve", "google-cloud"}
ONPREM_FEATURES = {"serve", "redfish"}
IMAGE_FEATURES = CLOUD_RUN_FEATURES | ONPREM_FEATURES

FINAL_BASE = re.compile(r"^gcr\.io/distroless/cc-debian12:nonroot(@sha256:[0-9a-f]{64})?$")
RUST_BASE = re.compile(
    r"^(?:docker\.io/)?(?:library/)?rust:(?P<version>\d+\.\d+(?:\.\d+)?)-bookworm(?:@sha256:[0-9a-f]{64})?$"
)


@dataclass
class Stage:
    base: str
    alias: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, instruction: str) -> list[str]:
        return [value for name, value in self.instructions if name == instruction]


def stages(dockerfile: str, build_args: dict[str, str] | None = None) -> list[Stage]:
    """The stages, with each ARG's value (the build argument given, or its default) put in
    the RUN commands of the stages that declare it, as Docker does."""
    build_args = build_args or {}
    parser = DockerfileParser(fileobj=io.BytesIO(dockerfile.encode()), build_args=build_args)
    bases = parser.parent_images
    out: list[Stage] = []
    defaults: dict[str, str] = {}
    scope: dict[str, str] = {}
    for item in parser.structure:
        name, value = item["instruction"], item["value"]
        if name == "FROM":
            alias = re.search(r"\s+AS\s+(\S+)\s*$", value, re.IGNORECASE)
            out.append(Stage(base=bases[len(out)], alias=alias.group(1) if alias else None))
            scope = {}
        elif name == "ARG":
            key, eq, default = value.strip().partition("=")
            if eq:
                (scope if out else defaults)[key] = default.strip('"')
            elif key in defaults:
                scope[key] = defaults[key]
            if key in build_args and (out or not eq):
                scope[key] = build_args[key]
            if out:
                out[-1].instructions.append((name, value))
        elif out and name != "COMMENT":
            if name == "RUN":
                value = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: scope.get(m[1] or m[2], m[0]), value)
            out[-1].instructions.append((name, value))
    return out


def workspace_rust_version() -> tuple[int, ...]:
    cargo = tomllib.loads((REPO / "Cargo.toml").read_text(encoding="utf-8"))
    return version_tuple(cargo["workspace"]["package"]["rust-version"])


def version_tuple(version: str) -> tuple[int, ...]:
    parts = tuple(int(p) for p in version.split("."))
    return parts + (0,) * (3 - len(parts))


@dataclass
class CargoBuild:
    stage: Stage
    workdir: str
    argv: list[str]

    def options(self, *names: str) -> list[str]:
        """Every value of an option given as `NAME VALUE` or `NAME=VALUE`."""
        found = []
        for i, arg in enumerate(self.argv):
            for name in names:
                if arg == name and i + 1 < len(self.argv):
                    found.append(self.argv[i + 1])
                elif arg.startswith(name + "="):
                    found.append(arg.split("=", 1)[1])
        return found

    def output(self) -> str:
        env = dict(parse_env(value) for value in self.stage.values("ENV") if "=" in value)
        target_dir = (self.options("--target-dir") or [env.get("CARGO_TARGET_DIR", "target")])[-1]
        triple = self.options("--target")
        profile = "release" if "--release" in self.argv else "debug"
        path = posixpath.join(self.workdir, target_dir, *triple[-1:], profile, BIN)
        return posixpath.normpath(path)


def parse_env(value: str) -> tuple[str, str]:
    key, _, rest = value.partition("=")
    return key.strip(), rest.strip().strip('"')


def cargo_builds(stage: Stage) -> list[CargoBuild]:
    builds = []
    workdir = "/"
    for name, value in stage.instructions:
        if name == "WORKDIR":
            workdir = posixpath.join(workdir, value.strip())
        if name != "RUN":
            continue
        words = shlex.split(value)
        # RUN's own flags (--mount, --network, --security) come before the command.
        while words and words[0].startswith("--"):
            words.pop(0)
        command: list[str] = []
        for word in words + ["&&"]:
            if word in ("&&", ";", "||"):
                if command[:2] == ["cargo", "build"]:
                    builds.append(CargoBuild(stage, workdir, command))
                command = []
            else:
                command.append(word)
    return builds


def exec_form(value: str) -> list[str] | None:
    try:
        argv = json.loads(value)
    except json.JSONDecodeError:
        return None
    return argv if isinstance(argv, list) and all(isinstance(a, str) for a in argv) else None


def image_problems(
    dockerfile: str,
    rust_version: tuple[int, ...],
    build_args: dict[str, str] | None = None,
    expected_features: set[str] = CLOUD_RUN_FEATURES,
) -> list[str]:
    all_stages = stages(dockerfile, build_args)
    if len(all_stages) < 2:
        return [f"not multi-stage: {len(all_stages)} stage(s)"]
    *build_stages, final = all_stages
    problems = []

    if not FINAL_BASE.match(final.base):
        problems.append(f"final base {final.base!r} is not gcr.io/distroless/cc-debian12:nonroot")
    if final.values("USER") != ["nonroot"]:
        problems.append(f"final stage USER is {final.values('USER')}, not ['nonroot']")
    if "8080" not in " ".join(final.values("EXPOSE")).split():
        problems.append("final stage does not EXPOSE 8080")
    if final.values("RUN"):
        problems.append("final stage has RUN: distroless has no shell")

    builds = [b for stage in build_stages for b in cargo_builds(stage)]
    if len(builds) != 1:
        return problems + [f"{len(builds)} cargo build commands in the build stages, expected one"]
    build = builds[0]
    for flag in ("--release", "--locked"):
        if flag not in build.argv:
            problems.append(f"cargo build without {flag}")
    features = {f for value in build.options("--features", "-F") for f in re.split(r"[,\s]+", value) if f}
    if features != expected_features:
        problems.append(f"cargo build features {sorted(features)}, expected {sorted(expected_features)}")
    if build.options("--package", "-p") != [PACKAGE]:
        problems.append(f"cargo build packages {build.options('--package', '-p')}, expected [{PACKAGE!r}]")
    if build.options("--bin") != [BIN]:
        problems.append(f"cargo build bins {build.options('--bin')}, expected [{BIN!r}]")

    rust = RUST_BASE.match(build.stage.base)
    if not rust:
        problems.append(f"build base {build.stage.base!r} is not rust:<version>-bookworm")
    elif version_tuple(rust["version"]) < rust_version:
        problems.append(f"build base Rust {rust['version']} is older than the workspace's {rust_version}")

    names = {build.stage.alias, str(all_stages.index(build.stage))}
    copies = []
    for value in final.values("COPY"):
        words = shlex.split(value)
        source = [w.split("=", 1)[1] for w in words if w.startswith("--from=")]
        if source and source[0] in names:
            copies.append([w for w in words if not w.startswith("--")])
    if len(copies) != 1 or len(copies[0]) != 2:
        return problems + [f"final stage copies {copies} from the build stage, expected one file"]
    copied, destination = copies[0]
    if posixpath.normpath(copied) != build.output():
        problems.append(f"copies {copied}, but cargo build writes {build.output()}")

    entrypoint, cmd = (exec_form_of(final, name) for name in ("ENTRYPOINT", "CMD"))
    if entrypoint is None or cmd is None:
        problems.append(f"ENTRYPOINT {entrypoint} and CMD {cmd} are not both in exec form")
    elif entrypoint != [destination] or entrypoint + cmd != [destination, "serve"]:
        problems.append(f"runs {entrypoint} + {cmd}, expected [{destination!r}] + ['serve']")
    return problems


def exec_form_of(stage: Stage, instruction: str) -> list[str] | None:
    """The last ENTRYPOINT or CMD of a stage (the one that counts), if in exec form."""
    values = stage.values(instruction)
    return exec_form(values[-1]) if values else None


def cloud_run_problems(dockerfile: str, module: str) -> list[str]:
    """What Cloud Run runs: the image's ENTRYPOINT with the module's `args` in place of CMD
    (or the module's `command` in place of ENTRYPOINT)."""
    containers = re.findall(r"^\s*containers\s*\{(.*?)^\s*resources\s*\{", module, re.MULTILINE | re.DOTALL)
    if len(containers) != 1:
        return [f"{len(containers)} containers blocks found in the module, expected one"]
    settings = dict(re.findall(r"^\s*(command|args)\s*=\s*(\[.*?\])\s*$", containers[0], re.MULTILINE))
    final = stages(dockerfile)[-1]
    entrypoint = exec_form(settings["command"]) if "command" in settings else exec_form_of(final, "ENTRYPOINT")
    args = exec_form(settings["args"]) if "args" in settings else exec_form_of(final, "CMD")
    if entrypoint is None or args is None:
        return [f"Cloud Run's command {entrypoint} or args {args} cannot be read"]
    binary = [w for w in shlex.split(final.values("COPY")[-1]) if not w.startswith("--")][-1]
    if entrypoint + args != [binary, "serve"]:
        return [f"Cloud Run runs {entrypoint + args}, expected [{binary!r}, 'serve']"]
    return []


def ignored(dockerignore: str, path: str) -> bool:
    """Whether the context leaves out `path` (a top-level folder): the last pattern that
    names it wins, as in Docker; only the forms that can name a folder are understood."""
    verdict = False
    for line in dockerignore.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/").removeprefix("./")
        if pattern in (path, f"**/{path}", f"{path}/**"):
            verdict = not negated
    return verdict


def dockerignore_problems(dockerignore: str) -> list[str]:
    return [f".dockerignore does not leave out {p}" for p in ("target", "tests/.stack") if not ignored(dockerignore, p)]


def expand(line: str, makefile: str) -> str:
    """`line` with each `$(NAME)` a variable of `makefile` names replaced by its value."""
    values = dict(re.findall(r"^([A-Z_]+)\s*:?=\s*(.*)$", makefile, re.MULTILINE))
    return re.sub(r"\$\(([A-Z_]+)\)", lambda m: values.get(m.group(1), m.group(0)), line)


def lambda_package_problems(makefile: str) -> list[str]:
    recipe = re.search(r"^package:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    if not recipe:
        return ["no package target in the Makefile"]
    lines = [expand(line, makefile) for line in recipe.group(1).splitlines()]
    build = [line for line in lines if "cargo lambda build" in line]
    if len(build) != 1:
        return [f"{len(build)} cargo lambda build lines in make package, expected one"]
    words = shlex.split(build[0].split("cargo lambda build", 1)[1])
    problems = []
    packages = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("--package", "-p")]
    packages += [w.split("=", 1)[1] for w in words if w.startswith("--package=")]
    if packages != [PACKAGE]:
        problems.append(f"make package builds packages {packages}, expected [{PACKAGE!r}]")
    enabled = sorted(f for f in IMAGE_FEATURES if any(f in w for w in words))
    if enabled or "--all-features" in words:
        problems.append(f"make package enables {enabled or 'every feature'}")
    return problems


def test_the_cloud_run_image_builds_its_binary_into_distroless():
    assert image_problems(DOCKERFILE.read_text(encoding="utf-8"), workspace_rust_version()) == []


def onprem_build_args(readme: str) -> dict[str, str]:
    """The build arguments of the `docker build` the on-premises README gives, which must
    tag the image `node-fencer-onprem`."""
    builds = [line for line in readme.splitlines() if "docker build" in line]
    assert len(builds) == 1, f"{len(builds)} docker build lines in {ONPREM_README}, expected one"
    words = shlex.split(builds[0].split("docker build", 1)[1])
    tags = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-t", "--tag")]
    assert [t.split(":")[0] for t in tags] == ["node-fencer-onprem"], tags
    values = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--build-arg"]
    return dict(v.split("=", 1) for v in values)


def test_the_onprem_image_builds_its_binary_into_distroless():
    build_args = onprem_build_args(ONPREM_README.read_text(encoding="utf-8"))
    problems = image_problems(
        DOCKERFILE.read_text(encoding="utf-8"), workspace_rust_version(), build_args, ONPREM_FEATURES
    )
    assert problems == []


def test_a_build_argument_the_dockerfile_does_not_declare_is_not_taken():
    problems = image_problems(
        DOCKERFILE.read_text(encoding="utf-8").replace("ARG FEATURES\n", ""),
        workspace_rust_version(),
        {"FEATURES": "serve,redfish"},
        ONPREM_FEATURES,
    )
    assert any("features" in p for p in problems), problems


def test_cloud_run_runs_serve_with_the_modules_args():
    problems = cloud_run_problems(DOCKERFILE.read_text(encoding="utf-8"), CLOUD_RUN_MODULE.read_text(encoding="utf-8"))
    assert problems == []


def test_the_build_context_leaves_out_build_output_and_state():
    assert dockerignore_problems(DOCKERIGNORE.read_text(encoding="utf-8")) == []


def test_the_lambda_zip_is_built_without_the_images_features():
    assert lambda_package_problems(MAKEFILE.read_text(encoding="utf-8")) == []


def plant(old: str, new: str) -> Callable[[str], str]:
    def change(text: str) -> str:
        assert old in text, f"nothing to plant: {old!r} is not in the file"
        return text.replace(old, new)

    return change


COPY_LINE = "COPY --from=build /src/target/release/node-fencer /node-fencer\n"

IMAGE_MISTAKES = {
    "one stage": (plant("FROM gcr.io/distroless/cc-debian12:nonroot\n" + COPY_LINE, ""), "not multi-stage"),
    "debian base": (plant("gcr.io/distroless/cc-debian12:nonroot", "debian:bookworm-slim"), "final base"),
    "root tag": (plant("cc-debian12:nonroot", "cc-debian12:latest"), "final base"),
    "static image": (plant("distroless/cc-debian12", "distroless/static-debian12"), "final base"),
    "USER root": (plant("USER nonroot", "USER root"), "USER"),
    "no EXPOSE": (plant("EXPOSE 8080", "EXPOSE 9090"), "EXPOSE 8080"),
    "without --locked": (plant(" --locked", ""), "without --locked"),
    "without --release": (plant(" --release", ""), "without --release"),
    "without features": (plant(' --features "${FEATURES}"', ""), "features []"),
    "another feature": (plant("ARG FEATURES=serve,google-cloud", "ARG FEATURES=serve,redfish"), "expected"),
    "a feature more": (plant("ARG FEATURES=serve,google-cloud", "ARG FEATURES=serve,google-cloud,redfish"), "expected"),
    "the whole workspace": (plant(" --package node-fencer", ""), "packages"),
    "another bin": (plant("--bin node-fencer", "--bin local-run"), "bins"),
    "two builds": (
        plant("--bin node-fencer\n", "--bin node-fencer && cargo build --release --bin x\n"),
        "2 cargo build",
    ),
    "older Rust": (plant("RUST_VERSION=1.94", "RUST_VERSION=1.93"), "older than"),
    "older Rust, one digit": (plant("RUST_VERSION=1.94", "RUST_VERSION=1.9"), "older than"),
    "another Debian": (plant("-bookworm AS build", "-bullseye AS build"), "build base"),
    "a debug path": (plant("/src/target/release/node-fencer", "/src/target/debug/node-fencer"), "but cargo build writes"),
    "a target triple": (
        plant("--bin node-fencer\n", "--bin node-fencer --target x86_64-unknown-linux-gnu\n"),
        "but cargo build writes",
    ),
    "another workdir": (plant("WORKDIR /src", "WORKDIR /build"), "but cargo build writes"),
    "no CMD": (plant('CMD ["serve"]', ""), "not both in exec form"),
    "another command": (plant('CMD ["serve"]', 'CMD ["preflight"]'), "expected ['/node-fencer'] + ['serve']"),
    "serve twice": (plant('ENTRYPOINT ["/node-fencer"]', 'ENTRYPOINT ["/node-fencer", "serve"]'), "expected"),
    "serve in ENTRYPOINT alone": (
        plant('ENTRYPOINT ["/node-fencer"]\nCMD ["serve"]', 'ENTRYPOINT ["/node-fencer", "serve"]'),
        "not both in exec form",
    ),
    "entrypoint elsewhere": (plant('ENTRYPOINT ["/node-fencer"]', 'ENTRYPOINT ["/usr/bin/node-fencer"]'), "expected"),
    "shell form": (plant('ENTRYPOINT ["/node-fencer"]', "ENTRYPOINT /node-fencer"), "exec form"),
}


@pytest.mark.parametrize("mistake", sorted(IMAGE_MISTAKES))
def test_a_planted_image_mistake_is_reported(mistake: str):
    change, expected = IMAGE_MISTAKES[mistake]
    problems = image_problems(change(DOCKERFILE.read_text(encoding="utf-8")), workspace_rust_version())
    assert any(expected in p for p in problems), problems


def test_a_newer_workspace_rust_version_is_reported():
    major, minor, patch = workspace_rust_version()
    problems = image_problems(DOCKERFILE.read_text(encoding="utf-8"), (major, minor + 1, patch))
    assert any("older than" in p for p in problems), problems


@pytest.mark.parametrize(
    "dockerfile_change, module_change",
    [
        (plant('ENTRYPOINT ["/node-fencer"]', 'ENTRYPOINT ["/node-fencer", "serve"]'), lambda m: m),
        (lambda d: d, plant('args  = ["serve"]', 'args  = ["serve", "--verbose"]')),
        (lambda d: d, plant('args  = ["serve"]', 'args  = []')),
        (lambda d: d, plant('args  = ["serve"]', 'args  = ["serve"]\n      command = ["/bin/sh"]')),
    ],
    ids=["serve in the image's ENTRYPOINT too", "another argument", "no argument", "another command"],
)
def test_a_planted_cloud_run_mistake_is_reported(dockerfile_change, module_change):
    problems = cloud_run_problems(
        dockerfile_change(DOCKERFILE.read_text(encoding="utf-8")),
        module_change(CLOUD_RUN_MODULE.read_text(encoding="utf-8")),
    )
    assert any("Cloud Run runs" in p for p in problems), problems


@pytest.mark.parametrize(
    "change",
    [
        plant("\ntarget\n**/target\n", "\n"),
        lambda text: text + "!target\n",
        plant("tests/.stack\n", ""),
    ],
    ids=["target not ignored", "target re-included", "stack state not ignored"],
)
def test_a_planted_dockerignore_mistake_is_reported(change: Callable[[str], str]):
    assert dockerignore_problems(change(DOCKERIGNORE.read_text(encoding="utf-8")))


@pytest.mark.parametrize(
    "change, expected",
    [
        (plant(" --package node-fencer", ""), "packages []"),
        (plant("--package node-fencer", "--package node-fencer --features google-cloud"), "enables"),
        (plant("--package node-fencer", "--package node-fencer --features serve,redfish"), "enables"),
        (plant("--package node-fencer", "--package node-fencer-tests"), "packages"),
    ],
    ids=["the whole workspace", "google-cloud enabled", "serve enabled", "another package"],
)
def test_a_planted_package_mistake_is_reported(change: Callable[[str], str], expected: str):
    problems = lambda_package_problems(change(MAKEFILE.read_text(encoding="utf-8")))
    assert any(expected in p for p in problems), problems
