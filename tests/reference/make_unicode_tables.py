#!/usr/bin/env python3
"""Writes src/data/tokenizer/hf_unicode_tables.cpp, the Unicode data where shardlm's libraries and the pinned
`tokenizers` disagree (their Unicode versions differ):
  - for each Unicode property a tokenizer.json regex may use, the code points that tokenizers'
    Oniguruma puts in it and the system PCRE2 does not;
  - the code points that the system utf8proc normalizes (combining class, decomposition,
    composition) while tokenizers' normalizers (an older Unicode) leave them inert, as
    unassigned characters: tokenizers' NFC/NFD/NFKC/NFKD of a text equals utf8proc's of the
    pieces between them, with them kept as they are. A code point where the two disagree otherwise
    goes to a refused list.

    /opt/shardlm/venv/bin/python tests/reference/make_unicode_tables.py > src/data/tokenizer/hf_unicode_tables.cpp

Oniguruma's sets are read from the pinned `tokenizers` itself (a Split pre-tokenizer with behavior
"removed" over every code point drops exactly the matching ones); PCRE2's from a small C program
compiled against the system libpcre2-8. A property where PCRE2 has a code point Oniguruma lacks
cannot be fixed by adding code points and is left out (shardlm then refuses it).
"""
import os
import subprocess
import sys
import tempfile

from tokenizers import Regex, pre_tokenizers
import tokenizers

PROPS = ["L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No", "P", "S", "Z"]
CPS = [c for c in range(0x110000) if not (0xD800 <= c < 0xE000)]

C_SOURCE = r"""
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
int main(int argc, char** argv) {
  int err; PCRE2_SIZE off;
  pcre2_code* re = pcre2_compile((PCRE2_SPTR)argv[1], PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &err, &off, NULL);
  pcre2_match_data* md = pcre2_match_data_create(1, NULL);
  for (unsigned c = 0; c < 0x110000; ++c) {
    if (c >= 0xD800 && c < 0xE000) continue;
    unsigned char b[4]; int n;
    if (c < 0x80) { b[0] = c; n = 1; }
    else if (c < 0x800) { b[0] = 0xC0 | (c >> 6); b[1] = 0x80 | (c & 63); n = 2; }
    else if (c < 0x10000) { b[0] = 0xE0 | (c >> 12); b[1] = 0x80 | ((c >> 6) & 63); b[2] = 0x80 | (c & 63); n = 3; }
    else { b[0] = 0xF0 | (c >> 18); b[1] = 0x80 | ((c >> 12) & 63); b[2] = 0x80 | ((c >> 6) & 63); b[3] = 0x80 | (c & 63); n = 4; }
    if (pcre2_match(re, b, n, 0, 0, md, NULL) >= 0) printf("%x\n", c);
  }
  return 0;
}
"""


def onig_set(prop):
    split = pre_tokenizers.Split(Regex(prop), behavior="removed", invert=False)
    out = set()
    for i in range(0, len(CPS), 4096):
        chunk = CPS[i:i + 4096]
        kept = set()
        for piece, _ in split.pre_tokenize_str("".join(map(chr, chunk))):
            kept.update(piece)
        out.update(c for c in chunk if chr(c) not in kept)
    return out


def normalization_candidates():
    """The code points utf8proc does anything with when normalizing (a combining class, a
    decomposition, or a part of one); both libraries leave every other one alone."""
    return _normalization(False)


def normalization_tables():
    return _normalization(True)


def _normalization(classify):
    import ctypes
    from tokenizers import normalizers
    lib = ctypes.CDLL("libutf8proc.so.2")
    libc = ctypes.CDLL("libc.so.6")
    lib.utf8proc_get_property.restype = ctypes.POINTER(ctypes.c_int16)  # [category, combining_class, ...]
    forms = {}
    for name in ("NFC", "NFD", "NFKC", "NFKD"):
        fn = getattr(lib, "utf8proc_" + name)
        fn.restype = ctypes.c_void_p
        forms[name] = (fn, getattr(normalizers, name)())

    def u8p(fn, text):
        ptr = fn(text.encode())
        out = ctypes.string_at(ptr).decode()
        libc.free(ctypes.c_void_p(ptr))
        return out

    # Candidates: what utf8proc does anything with (a combining class, a decomposition, or a part
    # of one); everything else both libraries leave alone.
    cand = set()
    for c in CPS[1:]:
        if lib.utf8proc_get_property(c)[1] != 0:
            cand.add(c)
        d = u8p(forms["NFKD"][0], chr(c))
        if d != chr(c):
            cand.add(c)
            cand.update(map(ord, d))
    if not classify:
        return sorted(cand)
    probes = lambda s: [s, "e" + s + "\u0327", "a" + s + "\u0301", s + "\u0301", "\u0301" + s, "a" + s, s + "a"]
    inert, refused = [], []
    for c in sorted(cand):
        ps = probes(chr(c))
        if all(u8p(fn, p) == tok.normalize_str(p) for fn, tok in forms.values() for p in ps):
            continue
        # inert in tokenizers: every probe comes back unchanged (a starter that takes part in nothing)
        if all(tok.normalize_str(p) == p for _, tok in forms.values() for p in ps):
            inert.append(c)
        else:
            refused.append(c)
    return inert, refused


def ranges(cps):
    out = []
    for c in sorted(cps):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def main():
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "dump.c"), os.path.join(d, "dump")
        with open(src, "w") as f:
            f.write(C_SOURCE)
        subprocess.run(["cc", "-O2", src, "-o", exe, "-lpcre2-8"], check=True)
        pcre_version = subprocess.run(["pkg-config", "--modversion", "libpcre2-8"], capture_output=True, text=True).stdout.strip()
        rows, skipped = [], []
        for p in PROPS:
            pat = "\\p{" + p + "}"
            pcre = {int(x, 16) for x in subprocess.run([exe, pat], capture_output=True, text=True, check=True).stdout.split()}
            onig = onig_set(pat)
            if pcre - onig:
                skipped.append(p)
                continue
            body = "".join(f"\\\\x{{{a:x}}}" if a == b else f"\\\\x{{{a:x}}}-\\\\x{{{b:x}}}" for a, b in ranges(onig - pcre))
            rows.append((p, body))
    w = sys.stdout.write
    utf8proc_version = subprocess.run(["pkg-config", "--modversion", "libutf8proc"], capture_output=True, text=True).stdout.strip()
    w("// GENERATED by tests/reference/make_unicode_tables.py (do not edit). Where the Unicode data of\n")
    w(f"// tokenizers {tokenizers.__version__} differs from the system's PCRE2 {pcre_version} and utf8proc (pkg-config {utf8proc_version}):\n")
    w("// per regex property, the code points Oniguruma has and PCRE2 lacks (appended to each \\p{...},\n")
    w("// hf_text.cpp); the code points utf8proc normalizes and tokenizers leaves inert (texts are\n")
    w("// normalized around them); those the two normalize differently otherwise (refused). Rerun the\n")
    w("// script when a library changes; test_hf_tokenizer.cpp checks the properties code point by code\n")
    w("// point against tokenizers.\n")
    w('#include "data/tokenizer/hf_text.h"\n\nnamespace shardlm::data::hf {\n\n')
    w("const char* onig_extra_class(std::string_view property) {\n")
    for p, body in rows:
        w(f'  if (property == "{p}") return "{body}";\n')
    w(f"  return nullptr;  // not supported{(': ' + ', '.join(skipped) + ' cannot be matched exactly') if skipped else ''}\n")
    w("}\n\n")
    inert, refused = normalization_tables()
    for fname, cps, what in (("normalization_inert", inert, "utf8proc normalizes but tokenizers leaves as it is"),
                             ("normalization_refused", refused, "the two normalize differently otherwise")):
        w(f"// {len(cps)} code points {what}.\n")
        w(f"bool {fname}(char32_t c) {{\n  static const char32_t table[][2] = {{")
        rs = ranges(cps)
        w(",".join(f"{{0x{a:x}, 0x{b:x}}}" for a, b in rs) if rs else "{0, 0}")
        w("};\n")
        w("  size_t lo = 0, hi = sizeof(table) / sizeof(table[0]);\n")
        w("  while (lo < hi) {\n    const size_t mid = (lo + hi) / 2;\n")
        w("    if (c < table[mid][0]) hi = mid; else if (c > table[mid][1]) lo = mid + 1; else return " + ("true" if rs else "false") + ";\n  }\n")
        w("  return false;\n}\n\n")
    w("const std::vector<std::string>& onig_supported_properties() {\n")
    w("  static const std::vector<std::string> props = {" + ", ".join(f'"{p}"' for p, _ in rows) + "};\n")
    w("  return props;\n}\n\n}  // namespace shardlm::data::hf\n")


if __name__ == "__main__":
    main()
