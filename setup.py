"""Build kpool: the C core as libkpool.so, the extension kpool._core linked
against it, and the stress executable kpool-stress, all inside the package.

Layout of the installed package (DESIGN.md section 3):

    kpool/libkpool.so          the core (soname libkpool.so); one heap per process
    kpool/_core.*.so           the CPython binding, linked to ./libkpool.so (rpath $ORIGIN)
    kpool/_numpy.*.so          numpy's data memory on kpool (NEP 49 handler), linked the
                               same way; built against numpy's headers (a build requirement
                               in pyproject.toml), left out with a warning when numpy is
                               missing at build time (kpool.numpy_handler() then raises
                               ImportError)
    kpool/libkpool-malloc.so   kpool as the process's malloc (LD_PRELOAD; kpool.get_preload()),
                               its own copy of the core, exporting only the allocation calls
    kpool/kpool-stress         the stress driver as an executable (rpath $ORIGIN)
    kpool/include/kpool.h      the public header (kpool.get_include())

Everything is compiled with setuptools' own compiler object, so `pip install .`
needs only a C compiler and Python; `make -C csrc` is not involved. The core
and the stress driver are compiled with exactly the flags below (not
Python's CFLAGS); the binding gets Python's flags plus warnings. Set
KPOOL_WERROR=1 to make warnings in the binding errors too (CI does).
"""

import copy
import glob
import os
import re
import shlex
import shutil

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("csrc")

CORE_FLAGS = [
    "-std=c11", "-O2", "-fPIC", "-pthread", "-D_GNU_SOURCE", "-fvisibility=hidden",
    "-Wall", "-Wextra", "-Werror",
]
BINDING_FLAGS = ["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Wno-missing-field-initializers",
                 "-Wno-unused-parameter", "-fvisibility=hidden"]


def read_version():
    """The version from KPOOL_VERSION_STRING in the public header."""
    with open(os.path.join(HERE, "csrc", "include", "kpool.h")) as f:
        m = re.search(r'#define\s+KPOOL_VERSION_STRING\s+"([^"]+)"', f.read())
    return m.group(1) if m else "0.0.0"


def core_sources():
    """Every .c directly in csrc/ (not subfolders), sorted."""
    return sorted(glob.glob(os.path.join(CSRC, "*.c")))


def stress_source(name):
    """csrc/stress/<name> if it exists, else None."""
    path = os.path.join(CSRC, "stress", name)
    return path if os.path.exists(path) else None


class kpool_build_ext(build_ext):
    """build_ext that first builds libkpool.so (and kpool-stress) next to the extension."""

    def _plain_compiler(self):
        """A copy of self.compiler that uses the bare C compiler, without Python's flags."""
        cc = copy.copy(self.compiler)
        exe = shlex.split(os.environ["CC"]) if os.environ.get("CC") else [self.compiler.compiler_so[0]]
        cc.set_executables(
            compiler=exe, compiler_so=exe, compiler_cxx=exe,
            linker_so=exe + ["-shared"], linker_exe=exe,
        )
        cc.include_dirs, cc.library_dirs, cc.runtime_library_dirs = [], [], []  # no Python paths in the core
        cc.macros, cc.libraries = [], []
        return cc

    extra_outputs = ()  # (path under the build folder, path relative to the package)

    def build_extensions(self):
        pkgdir = os.path.dirname(self.get_ext_fullpath("kpool._core"))
        self.extra_outputs = []
        os.makedirs(pkgdir, exist_ok=True)
        tmp = os.path.join(self.build_temp, "kpool-core")
        cc = self._plain_compiler()
        incs = [os.path.join(CSRC, "include"), CSRC]

        # 1. the core: libkpool.so
        objs = cc.compile(core_sources(), output_dir=tmp, include_dirs=incs,
                          extra_postargs=CORE_FLAGS, depends=self._core_headers())
        lib = os.path.join(pkgdir, "libkpool.so")
        cc.link_shared_object(objs, lib, extra_postargs=["-Wl,-soname,libkpool.so", "-pthread", "-lm"])
        self.extra_outputs.append((lib, "libkpool.so"))

        # 1b. the drop-in malloc: the same objects plus the shim, exports by version script
        preload_c = os.path.join(CSRC, "preload", "malloc.c")
        preload_objs = cc.compile([preload_c], output_dir=tmp, include_dirs=incs,
                                  extra_postargs=CORE_FLAGS + ["-fexceptions"], depends=self._core_headers())
        preload = os.path.join(pkgdir, "libkpool-malloc.so")
        cc.link_shared_object(preload_objs + objs, preload, extra_postargs=[
            "-Wl,--version-script=" + os.path.join(CSRC, "preload", "exports.map"), "-pthread", "-lm"])
        self.extra_outputs.append((preload, "libkpool-malloc.so"))

        # 2. the header, for kpool.get_include()
        incdir = os.path.join(pkgdir, "include")
        os.makedirs(incdir, exist_ok=True)
        shutil.copyfile(os.path.join(CSRC, "include", "kpool.h"), os.path.join(incdir, "kpool.h"))
        self.extra_outputs.append((os.path.join(incdir, "kpool.h"), os.path.join("include", "kpool.h")))

        # 3. the stress driver: one object for the extension, plus the executable
        stress_c, main_c = stress_source("stress.c"), stress_source("main.c")
        stress_objs = []
        if stress_c:
            stress_objs = cc.compile([stress_c], output_dir=tmp, include_dirs=incs + [os.path.join(CSRC, "stress")],
                                     extra_postargs=CORE_FLAGS)
            if main_c:
                main_objs = cc.compile([main_c], output_dir=tmp, include_dirs=incs + [os.path.join(CSRC, "stress")],
                                       extra_postargs=CORE_FLAGS)
                cc.link_executable(stress_objs + main_objs, "kpool-stress", output_dir=pkgdir,
                                   library_dirs=[pkgdir], libraries=["kpool", "dl", "m"],
                                   extra_postargs=["-Wl,-rpath,$ORIGIN", "-pthread"])
                self.extra_outputs.append((os.path.join(pkgdir, "kpool-stress"), "kpool-stress"))

        # 4. the bindings, linked to the libkpool.so above; the stress driver goes into _core only
        werror = ["-Werror"] if os.environ.get("KPOOL_WERROR") == "1" else []
        for ext in self.extensions:
            ext.library_dirs = [pkgdir] + list(ext.library_dirs or [])
            ext.extra_compile_args = BINDING_FLAGS + werror + list(ext.extra_compile_args or [])
            if ext.name == "kpool._core":
                ext.extra_objects = stress_objs + list(ext.extra_objects or [])
                if stress_c:
                    ext.define_macros = list(ext.define_macros or []) + [("KPOOL_HAVE_STRESS", "1")]
        super().build_extensions()

    def get_outputs(self):
        return super().get_outputs() + [path for path, _ in self.extra_outputs]

    def copy_extensions_to_source(self):
        """In-place builds (pip install -e ., build_ext --inplace): the core
        library, the header and kpool-stress go next to the extension too."""
        super().copy_extensions_to_source()
        dest = self.get_finalized_command("build_py").get_package_dir("kpool")
        for path, rel in self.extra_outputs:
            target = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(path, target)

    @staticmethod
    def _core_headers():
        """Headers whose change should rebuild the core."""
        return glob.glob(os.path.join(CSRC, "*.h")) + glob.glob(os.path.join(CSRC, "include", "*.h"))


NUMPY_SOURCE = os.path.join(CSRC, "python", "numpy_handler.c")

core_ext = Extension(
    "kpool._core",
    sources=sorted(p for p in glob.glob(os.path.join(CSRC, "python", "*.c")) if p != NUMPY_SOURCE),
    include_dirs=[os.path.join(CSRC, "include"), os.path.join(CSRC, "stress"), os.path.join(CSRC, "python")],
    depends=glob.glob(os.path.join(CSRC, "python", "*.h")) + glob.glob(os.path.join(CSRC, "include", "*.h")),
    libraries=["kpool", "dl", "m"],
    extra_link_args=["-Wl,-rpath,$ORIGIN", "-pthread"],
)



def numpy_ext():
    """kpool._numpy, or None (with a warning) when numpy is not importable at build time."""
    try:
        import numpy
    except ImportError:
        import warnings

        warnings.warn("numpy is not installed at build time: kpool._numpy (kpool.numpy_handler(), "
                      "kpool.use_for_numpy()) is not built")
        return None
    return Extension(
        "kpool._numpy",
        sources=[NUMPY_SOURCE],
        include_dirs=[os.path.join(CSRC, "include"), numpy.get_include()],
        depends=glob.glob(os.path.join(CSRC, "include", "*.h")),
        libraries=["kpool"],
        extra_link_args=["-Wl,-rpath,$ORIGIN"],
    )


setup(
    version=read_version(),
    ext_modules=[e for e in (core_ext, numpy_ext()) if e is not None],
    cmdclass={"build_ext": kpool_build_ext},
)
