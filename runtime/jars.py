"""Pinned jars from Maven Central for the Spark JVM: named sets in build/jars/<set>/, each jar's sha256 checked.

A set is a list of exact Maven coordinates, nothing resolved around them: the pom written for
it names each artifact with every transitive dependency excluded (`*:*`), so what lands is
exactly the list, and what the list leaves out (Scala, Hadoop's client, Netty, Apache
HttpClient, SLF4J, commons-*) is the copy pyspark ships in its own jars/ directory. Maven
fetches them (`mvn -q -B dependency:copy-dependencies`; Spark's own resolver,
`spark.jars.packages`, fails on this network while Maven works), into a scratch directory that
replaces build/jars/<set>/ only once every jar's sha256 matches runtime/jars.sha256, which is
checked into the repository. A set already there and matching is left alone, without Maven.

    python -m runtime.jars install delta s3     # what the Makefile runs (`make venv`, `make s3-deps`)
    python -m runtime.jars pin s3               # after changing a set below: fetch it and write its hashes

At run time `jar_paths(name)` gives a set's jars, or raises `JarsMissing` naming the make target
that installs it. LOGJAM_JARS_DIR moves build/jars elsewhere.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parent.parent
PINS = Path(__file__).with_name("jars.sha256")
# The plugin `dependency:` names, pinned, so that the Maven installed decides nothing.
DEPENDENCY_PLUGIN = "3.8.1"


@dataclass(frozen=True)
class Artifact:
    group: str
    artifact: str
    version: str

    @property
    def file_name(self) -> str:
        """The name copy-dependencies gives its jar."""
        return f"{self.artifact}-{self.version}.jar"

    def __str__(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"


@dataclass(frozen=True)
class JarSet:
    name: str
    make_target: str  # what installs it, for the error that says it is missing
    artifacts: tuple[Artifact, ...]


def _sdk(*modules: str) -> tuple[Artifact, ...]:
    return tuple(Artifact("software.amazon.awssdk", m, AWS_SDK) for m in modules)


# The AWS SDK v2 version hadoop-aws 3.5.0 is built against (hadoop-project 3.5.0's
# aws-java-sdk-v2.version), as its modules rather than its 686 MB `bundle`.
AWS_SDK = "2.35.4"

SETS: dict[str, JarSet] = {s.name: s for s in (
    # Delta Lake for Spark 4.2 (Scala 2.13). Reading and writing a Delta table through Spark's
    # DeltaCatalog needs only these two; delta-spark's pom also names delta-kernel-api/-defaults/
    # -unitycatalog, for its kernel-based V2 connector, which nothing here turns on.
    JarSet("delta", "make venv", (
        Artifact("io.delta", "delta-spark_4.2_2.13", "4.4.0"),
        Artifact("io.delta", "delta-storage", "4.4.0"),
    )),
    # s3a:// for Spark's Hadoop 3.5.0 (pyspark's hadoop-client-api/-runtime): hadoop-aws at the
    # same version and the SDK modules its S3 client, transfer manager (copy, upload) and async
    # client (Netty) load, with theirs. Left out: what pyspark ships (Netty 4.2, HttpClient 4.5,
    # commons-codec, SLF4J, jcl-over-slf4j for commons-logging) and what only an option not used
    # here loads (sts: assumed roles; kms and the encryption client: client-side encryption;
    # wildfly-openssl: fs.s3a.ssl.channel.mode=openssl).
    JarSet("s3", "make s3-deps", (
        Artifact("org.apache.hadoop", "hadoop-aws", "3.5.0"),
        # hadoop-aws's compile dependency: the analytics input stream (fs.s3a.input.stream.type).
        Artifact("software.amazon.s3.analyticsaccelerator", "analyticsaccelerator-s3", "1.3.1"),
        *_sdk("s3", "s3-transfer-manager", "aws-xml-protocol", "aws-query-protocol", "protocol-core", "arns",
              "profiles", "crt-core", "http-auth", "identity-spi", "http-auth-spi", "http-auth-aws",
              "http-auth-aws-eventstream", "checksums", "checksums-spi", "retries-spi", "retries", "sdk-core",
              "auth", "http-client-spi", "regions", "annotations", "utils", "utils-lite", "aws-core",
              "metrics-spi", "json-utils", "third-party-jackson-core", "endpoints-spi", "apache-client",
              "netty-nio-client"),
        Artifact("org.reactivestreams", "reactive-streams", "1.0.4"),
        Artifact("software.amazon.eventstream", "eventstream", "1.0.1"),
    )),
)}


class JarsError(RuntimeError):
    """A set that cannot be installed: Maven failed, or a jar is not the one pinned."""


class JarsMissing(JarsError):
    """A set not installed (or installed under other pins): `make_target` installs it."""

    def __init__(self, set_name: str, make_target: str, detail: str) -> None:
        super().__init__(f"jar set {set_name!r} is not installed ({detail}): run `{make_target}`")
        self.set_name = set_name
        self.make_target = make_target


def jars_dir() -> Path:
    return Path(os.environ.get("LOGJAM_JARS_DIR") or ROOT / "build" / "jars")


def jar_set(name: str) -> JarSet:
    try:
        return SETS[name]
    except KeyError:
        raise ValueError(f"unknown jar set {name!r} (known: {', '.join(sorted(SETS))})") from None


def pins() -> dict[str, str]:
    """'<set>/<jar>' -> its sha256, from runtime/jars.sha256 (sha256sum's format, relative to build/jars)."""
    pinned: dict[str, str] = {}
    if PINS.exists():
        for line in PINS.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                digest, path = line.split(maxsplit=1)
                pinned[path.lstrip("*")] = digest
    return pinned


def _expected(s: JarSet) -> dict[str, str]:
    """Each jar of the set -> its pinned sha256; a jar without a pin is an error."""
    pinned = pins()
    unpinned = [a.file_name for a in s.artifacts if f"{s.name}/{a.file_name}" not in pinned]
    if unpinned:
        raise JarsError(f"{PINS.relative_to(ROOT)} has no sha256 for {', '.join(unpinned)}: "
                        f"`python -m runtime.jars pin {s.name}` fetches the set and writes them")
    return {a.file_name: pinned[f"{s.name}/{a.file_name}"] for a in s.artifacts}


_MARK = ".verified"  # in a set's directory: the pins it was verified against


def _mark_text(expected: dict[str, str]) -> str:
    return "".join(f"{digest}  {name}\n" for name, digest in sorted(expected.items()))


def jar_paths(set_name: str) -> list[Path]:
    """The jars of an installed set, in the set's order; `JarsMissing` when it is not installed.

    Cheap enough for every start of a JVM: the hashes were checked at install, so this checks that
    each jar is there and that the install was verified against the pins the repository has now.
    """
    s = jar_set(set_name)
    directory = jars_dir() / s.name
    try:
        expected = _expected(s)
    except JarsError as e:
        raise JarsMissing(s.name, s.make_target, str(e)) from None
    mark = directory / _MARK
    if not mark.exists() or mark.read_text() != _mark_text(expected):
        raise JarsMissing(s.name, s.make_target, f"{directory} is not verified against {PINS.name}")
    paths = [directory / a.file_name for a in s.artifacts]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise JarsMissing(s.name, s.make_target, f"missing from {directory}: {', '.join(missing)}")
    return paths


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _mismatches(directory: Path, expected: dict[str, str]) -> list[str]:
    """What in `directory` differs from `expected`: a jar missing, another sha256, a file not in the set."""
    problems = []
    for name, digest in sorted(expected.items()):
        path = directory / name
        if not path.is_file():
            problems.append(f"{name}: missing")
        elif (actual := sha256(path)) != digest:
            problems.append(f"{name}: sha256 {actual}, pinned {digest}")
    extra = sorted(p.name for p in directory.glob("*") if p.name not in expected and p.name != _MARK)
    problems += [f"{name}: not in the set" for name in extra]
    return problems


def pom(s: JarSet) -> str:
    """A pom whose dependencies are exactly the set's artifacts, none of their own."""
    deps = "".join(
        "    <dependency>\n"
        f"      <groupId>{escape(a.group)}</groupId>\n"
        f"      <artifactId>{escape(a.artifact)}</artifactId>\n"
        f"      <version>{escape(a.version)}</version>\n"
        "      <exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions>\n"
        "    </dependency>\n" for a in s.artifacts)
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by runtime/jars.py for the jar set {escape(s.name)}; not kept. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>logjam-mesh.jars</groupId>
  <artifactId>{escape(s.name)}</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
{deps}  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-dependency-plugin</artifactId>
        <version>{DEPENDENCY_PLUGIN}</version>
      </plugin>
    </plugins>
  </build>
</project>
"""


def _fetch(s: JarSet, into: Path) -> None:
    """Maven copies the set's jars into `into`, from Maven Central (through the local repository)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsError("Maven (`mvn`) is not on PATH; it fetches the pinned jars (apt-get install maven)")
    work = into / ".pom"
    work.mkdir()
    (work / "pom.xml").write_text(pom(s))
    # -C: a download whose checksum does not match Maven Central's fails instead of warning.
    argv = [mvn, "-q", "-B", "-C", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
            f"-DoutputDirectory={into}", "-DexcludeTransitive=true", "-DincludeScope=runtime"]
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    shutil.rmtree(work)
    if done.returncode != 0:
        raise JarsError(f"mvn exited {done.returncode} fetching the jar set {s.name!r}:\n{done.stdout[-4000:]}")


@contextmanager
def _locked() -> Iterator[Path]:
    """build/jars, held by this process alone (two `make` runs at once install a set once)."""
    base = jars_dir()
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield base


def install(set_name: str) -> tuple[list[Path], bool]:
    """The set in build/jars/<set>/, verified: (its jars, whether Maven ran). Idempotent."""
    s = jar_set(set_name)
    expected = _expected(s)
    with _locked() as base:
        directory = base / s.name
        if directory.is_dir() and not _mismatches(directory, expected):
            (directory / _MARK).write_text(_mark_text(expected))
            return jar_paths(s.name), False
        scratch = Path(tempfile.mkdtemp(prefix=f".{s.name}-", dir=base))
        try:
            _fetch(s, scratch)
            problems = _mismatches(scratch, expected)
            if problems:
                raise JarsError(f"the jar set {s.name!r} from Maven is not the pinned one "
                                f"({PINS.relative_to(ROOT)}):\n  " + "\n  ".join(problems))
            (scratch / _MARK).write_text(_mark_text(expected))
            if directory.exists():
                shutil.rmtree(directory)
            scratch.chmod(0o755)
            scratch.rename(directory)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return jar_paths(s.name), True


def pin(set_name: str) -> dict[str, str]:
    """Fetch the set and write its jars' sha256 into runtime/jars.sha256 (replacing the set's old lines)."""
    s = jar_set(set_name)
    with _locked() as base, tempfile.TemporaryDirectory(prefix=f".pin-{s.name}-", dir=base) as tmp:
        _fetch(s, Path(tmp))
        digests = {f"{s.name}/{a.file_name}": sha256(Path(tmp, a.file_name)) for a in s.artifacts}
    kept = [line for line in (PINS.read_text().splitlines() if PINS.exists() else [])
            if not (line.strip() and not line.startswith("#") and line.split(maxsplit=1)[1].startswith(f"{s.name}/"))]
    PINS.write_text("\n".join(kept + [f"{d}  {p}" for p, d in digests.items()]) + "\n")
    return digests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.jars", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("install", "pin"))
    parser.add_argument("sets", nargs="+", metavar="SET", help=f"one of: {', '.join(SETS)}")
    args = parser.parse_args(argv)
    for name in args.sets:
        try:
            if args.action == "pin":
                print(f"runtime/jars.py: pinned {len(pin(name))} jars of {name!r} in {PINS.relative_to(ROOT)}")
                continue
            paths, fetched = install(name)
        except (JarsError, ValueError, OSError) as e:
            print(f"runtime/jars.py: {e}", file=sys.stderr)
            return 1
        size = sum(p.stat().st_size for p in paths) / 1e6
        how = "fetched and verified" if fetched else "already verified"
        print(f"runtime/jars.py: {name}: {len(paths)} jars, {size:.1f} MB in {paths[0].parent}, {how}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
