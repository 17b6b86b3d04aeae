"""A Dockerfile read as Docker reads it, enough for the image checks of tests/helm/test_images.py:
instructions with their line continuations joined and comment lines dropped, split into build
stages (`FROM IMAGE [AS NAME]`), and the rules gputap's images keep: every base an explicit,
pinned version (never `latest` or a bare major), no `ADD` of a URL (an unchecked download), and
the final stage ending as a non-root user."""

from __future__ import annotations

import re
from dataclasses import dataclass, field


class DockerfileError(ValueError):
    pass


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    @property
    def user(self) -> str:
        """The last USER of the stage; empty when it sets none (the base's, often root)."""
        users = [args for instr, args in self.instructions if instr == "USER"]
        return users[-1] if users else ""


@dataclass
class Dockerfile:
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def problems(self) -> list[str]:
        found = []
        names = {s.name for s in self.stages if s.name}
        for stage in self.stages:
            if stage.image in names:
                continue  # an earlier stage, pinned where it is defined
            if not pinned(stage.image):
                found.append(f"FROM {stage.image}: not pinned to a version (name:X.Y.Z...)")
            for instr, args in stage.instructions:
                if instr == "ADD" and re.search(r"\b(https?|git|ftp)://|git@", args):
                    found.append(f"ADD {args}: fetches a URL (download it in a checked RUN)")
        user = self.final.user.split(":")[0]
        if user in ("", "root", "0"):
            found.append(f"the final stage runs as root (USER {self.final.user or 'unset'})")
        return found


def pinned(image: str) -> bool:
    """`name:TAG` with TAG starting with a full major.minor.patch (`3.11.13-slim`, `4.4.0`), or
    a digest; `latest`, no tag, or a partial version (`3.11-slim`, `20-bookworm`) float."""
    if "@sha256:" in image:
        return True
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return False
    tag = last.split(":", 1)[1]
    return re.match(r"v?\d+\.\d+\.\d+", tag) is not None


def logical_lines(text: str) -> list[str]:
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not current):
            continue  # Docker drops comment lines, also inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1].strip() + " "
            continue
        current += stripped
        if current.strip():
            lines.append(current.strip())
        current = ""
    if current.strip():
        lines.append(current.strip())
    return lines


def parse_dockerfile(text: str) -> Dockerfile:
    stages: list[Stage] = []
    for line in logical_lines(text):
        instr, _, args = line.partition(" ")
        instr, args = instr.upper(), re.sub(r"\s+", " ", args.strip())
        if instr == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(image=words[0], name=name))
        elif instr == "ARG" and not stages:
            continue  # an ARG before the first FROM is allowed
        elif not stages:
            raise DockerfileError(f"{line}: an instruction before FROM")
        else:
            stages[-1].instructions.append((instr, args))
    if not stages:
        raise DockerfileError("no FROM")
    return Dockerfile(stages)
