# cffi hooks its extension into setuptools through `cffi_modules` only, and the shipped
# profiles, suites (with their own pytest.ini) and Allure config (thresholds/, suites/, allure/ at the top of the tree) are
# copied into the wheel as qual/data/; everything else is in pyproject.toml.
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = {"thresholds": ["*.toml"], "suites": ["*.py", "pytest.ini"], "allure": ["*.mjs"]}


class BuildWithShippedData(build_py):
    def run(self):
        super().run()
        for folder, patterns in SHIPPED.items():
            dest = Path(self.build_lib) / "qual" / "data" / folder
            dest.mkdir(parents=True, exist_ok=True)
            for f in sorted(f for pattern in patterns for f in Path(folder).glob(pattern)):
                shutil.copy2(f, dest / f.name)


setup(cffi_modules=["qual/_build.py:ffibuilder"], cmdclass={"build_py": BuildWithShippedData})
