// Package hostlist expands and compresses Slurm hostlist expressions such as
// "node[001-004,010],gpu[1-2]-ib".
//
// The grammar follows Slurm's src/common/hostlist.c (hostlist_create and
// hostlist_ranged_string, which back `scontrol show hostnames` and
// `scontrol show hostlist`):
//
//	expression = pattern { separator pattern }
//	separator  = "," | whitespace              (runs of separators are one; empty patterns are skipped)
//	pattern    = text { "[" ranges "]" text }  (text: any bytes but separators and brackets)
//	ranges     = range { "," range }
//	range      = number [ "-" number ]         (number: decimal digits, start <= end)
//
// Zero padding comes from the width of a range's start, as in Slurm: "n[08-10]"
// is n08 n09 n10, "n[8-10]" is n8 n9 n10 and "n[008-10]" is n008 n009 n010; the
// width of the end is ignored. A pattern with several bracket groups expands
// to their product in Slurm's order: with two groups the first varies slowest
// ("rack[1-2]-node[1-2]" is rack1-node1 rack1-node2 rack2-node1 rack2-node2);
// with three or more, the last group varies fastest, then the first, the
// second and so on, and the second-to-last slowest, because hostlist.c peels
// bracket groups off the prefix from the right. Duplicates are kept.
//
// Deliberate differences from Slurm:
//   - Text after the last bracket group ("gpu[1-2]-ib") is accepted; Slurm's
//     parser rejects it. Compress never writes such text, so its output is
//     always a hostlist Slurm itself can parse.
//   - Unbalanced or nested brackets, whitespace inside brackets, steps
//     ("a[1-10:2]"), signs and other non-digits in a range are errors naming
//     the bad part and its position. Slurm silently turns some of these into
//     odd host names (a missing "]" is appended; "n[1, 2]" gives n1 and n02).
//   - Newlines and other ASCII whitespace separate patterns like space and tab.
//   - Slurm refuses a single range of more than 65,536 hosts (MAX_RANGE);
//     this package instead bounds the whole expansion by MaxHosts and
//     MaxBytes, checked before anything is allocated.
//   - Slurm's multi-dimensional (BlueGene, Cray) "x" box notation and base-36
//     coordinates are not supported.
package hostlist
