"""Build warehouse/jars/logjam-localfs.jar from native/java/ with javac, against pyspark's Hadoop jar.

The jar holds logjam.fs.NioRawLocalFileSystem (and its checksummed twin), Hadoop's local
filesystem without the `chmod`/`ls`/`readlink` child processes it forks when there is no
libhadoop (see docs/operations.md). logjam-spark puts it on the driver's classpath and
names it in `fs.file.impl`; without the jar it logs one line and runs Hadoop's own class.

It compiles against the installed pyspark, so it runs after `pip install` (the Makefile's
venv target does that): `python native/jar.py`. The jar is rebuilt only when a source is
newer. No javac, or a failed compile, leaves no jar and a warning, unless
LOGJAM_NATIVE_WERROR=1 (CI sets it), which makes either an error, as for the C modules.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCES = HERE / "java"
JAR = ROOT / "warehouse" / "jars" / "logjam-localfs.jar"


def hadoop_api_jar() -> Path:
    """pyspark's hadoop-client-api jar: the API the classes extend, at the version they will run on."""
    from pyspark.find_spark_home import _find_spark_home

    jars = sorted((Path(_find_spark_home()) / "jars").glob("hadoop-client-api-*.jar"))
    if not jars:
        raise FileNotFoundError("no hadoop-client-api-*.jar in pyspark's jars directory")
    return jars[-1]


def up_to_date(sources: list[Path], api: Path) -> bool:
    if not JAR.exists():
        return False
    built = JAR.stat().st_mtime
    return all(p.stat().st_mtime <= built for p in sources + [api, Path(__file__)])


def build() -> Path:
    sources = sorted(SOURCES.rglob("*.java"))
    api = hadoop_api_jar()
    if up_to_date(sources, api):
        return JAR
    javac = shutil.which("javac") or (os.path.join(os.environ["JAVA_HOME"], "bin", "javac")
                                      if os.environ.get("JAVA_HOME") else None)
    if not javac or not os.path.exists(javac):
        raise FileNotFoundError("javac (a JDK 17+) is not on PATH")
    with tempfile.TemporaryDirectory(prefix="logjam-jar-") as tmp:
        # --release 17: the oldest JVM Spark 4 runs on; -Werror keeps the sources warning-free.
        subprocess.run([javac, "--release", "17", "-Xlint:all", "-Werror",
                        "-cp", str(api), "-d", tmp, *map(str, sources)], check=True)
        JAR.parent.mkdir(parents=True, exist_ok=True)
        partial = JAR.with_suffix(".tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: logjam-mesh native/jar.py\n\n")
            for cls in sorted(Path(tmp).rglob("*.class")):
                jar.write(cls, cls.relative_to(tmp).as_posix())
        partial.replace(JAR)
    return JAR


def main() -> int:
    strict = os.environ.get("LOGJAM_NATIVE_WERROR", "") not in ("", "0")
    try:
        path = build()
    except (OSError, subprocess.CalledProcessError, ImportError) as e:
        print(f"native/jar.py: cannot build {JAR.relative_to(ROOT)}: {e}", file=sys.stderr)
        if strict:
            return 1
        print("native/jar.py: logjam-spark will use Hadoop's forking local filesystem", file=sys.stderr)
        return 0
    print(f"native/jar.py: {path.relative_to(ROOT)} ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
