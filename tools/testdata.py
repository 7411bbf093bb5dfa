"""Where the test material lives (testdata/README.md): CNTK's reader tests, real CNTK data and the Python
model of CNTK 2.7's readers. It ships in the repository's testdata/; when $CNTKIO_SHARED_DIR is set, it is
read from that folder instead, in the project's shared/ layout (conformance/cntk, data/real,
conformance/tools). The Rust tests find it the same way (crates/cntkio/tests/common/testdata.rs)."""
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# part: (folder under testdata/, folder under $CNTKIO_SHARED_DIR)
_PARTS = {
    'cntk': ('cntk', os.path.join('conformance', 'cntk')),
    'real': ('real', os.path.join('data', 'real')),
    'model': ('model', os.path.join('conformance', 'tools')),
}


def testdata_dir(part):
    """The folder of one part: 'cntk' (CNTK's reader tests), 'real' (real CNTK data) or 'model' (the Python
    model). Raises FileNotFoundError, naming the folder, if it is missing."""
    in_repo, in_shared = _PARTS[part]
    shared = os.environ.get('CNTKIO_SHARED_DIR')
    d = os.path.join(shared, in_shared) if shared else os.path.join(REPO, 'testdata', in_repo)
    if not os.path.isdir(d):
        raise FileNotFoundError(
            f"the test material is missing: {d} is not a folder (it ships in the repository's testdata/; "
            "$CNTKIO_SHARED_DIR, when set, must hold conformance/ and data/ as shared/ does)")
    return d
