"""kanri's container images: built without a daemon by ``make images`` (see docs/images.md).

:mod:`kanri.images.catalog` reads what a build produced (``.build/images/images.json``); the build itself is
``python -m kanri.images build``.
"""
