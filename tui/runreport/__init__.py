"""``anatomy-top report``: a recorded run as one self-contained HTML page (inline SVG charts) or a PNG."""
