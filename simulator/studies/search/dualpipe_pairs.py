"""DualPipe's overlapped forward/backward pairs, costed on one compute stream.

Part of the analytic step-time estimate (:mod:`simulator.studies.search.estimate`): a DualPipe rank's
schedule has steps that run a forward and a backward of two micro-batches interleaved layer by
layer, their expert all-to-alls hidden behind the other half's compute. :func:`pair_time` costs
one such pair, :func:`dualpipe_busy` a rank's whole schedule.
"""

from __future__ import annotations


def pair_time(f_layers, b_layers, slowdown: float) -> float:
    """Seconds of one DualPipe forward/backward pair on the compute stream: the two halves'
    layers interleaved as the trace does (``workloads.trace.program.RankProgram._interleave``, the
    backward half first), its compute ops ``slowdown`` times longer, the expert all-to-alls
    in order on one communication stream, each starting when issued (and the stream is
    free) and waited for by the op that needs it. ``f_layers``: per forward layer
    ``(attention + router, shared, experts, output, dispatch, combine)``; ``b_layers``
    (backward order): ``(recompute + output grad, shared grad, experts input grad, experts
    weight grad, router + attention grad, combine grad, dispatch grad)``."""
    T = C = 0.0

    def issue(d: float) -> float:
        nonlocal C
        if d <= 0:
            return T
        C = max(T, C) + d
        return C

    pend = None  # the previous forward layer's combine and output op
    for i in range(max(len(f_layers), len(b_layers))):
        if i < len(b_layers):
            rp, bs, ei, ew, ba, a_bc, a_bd = b_layers[i]
            T += slowdown * rp
            e_bc = issue(a_bc)
            T += slowdown * bs
        if pend is not None:
            T = max(T, pend[0]) + slowdown * pend[1]
            pend = None
        if i < len(f_layers):
            fa, fs, fe, fp, a_fd, a_fc = f_layers[i]
            T += slowdown * fa
            e_fd = issue(a_fd)
            T += slowdown * fs
        if i < len(b_layers):
            T = max(T, e_bc) + slowdown * ei
            e_bd = issue(a_bd)
            T += slowdown * ew
        if i < len(f_layers):
            T = max(T, e_fd) + slowdown * fe
            pend = (issue(a_fc), fp)
        if i < len(b_layers):
            T = max(T, e_bd) + slowdown * ba
    if pend is not None:
        T = max(T, pend[0]) + slowdown * pend[1]
    return T


def dualpipe_busy(steps, own, chunks, layer, seg, extras, n_chunks, send_f, send_b, slowdown):
    """A DualPipe rank's busy time over the step and its mean pair time: every step of its
    schedule (``steps``, :func:`step_terms` of its counts) costed on its own chunk — a lone
    ``F`` / ``B`` / ``I`` / ``W`` as without overlap, an ``F`` + ``B`` pair by
    :func:`pair_time` plus what blocks the stream in both halves (TP, CP, ZeRO-3 gathers)
    and both halves' embedding / head compute (slowed) and pipeline sends."""
    n_local = len(own)
    cost = {op: [0.0] * n_local for op in "FBIW"}
    fl, bl, blk_f, blk_b, ext_f, ext_b = ([], [], [0.0] * n_local, [0.0] * n_local, [0.0] * n_local, [0.0] * n_local)
    for c, k in enumerate(own):
        f_c, b_c = [], []
        for l in chunks[k]:
            d = layer(l)
            for op in "FBIW":
                cost[op][c] += d[op]
            sf, sb, xf, xb = seg(l)
            f_c.append(sf)
            b_c.append(sb)
            blk_f[c] += xf
            blk_b[c] += xb
        fl.append(f_c)
        bl.append(b_c[::-1])
        for u, has in (("embed", k == 0), ("head", k == n_chunks - 1)):
            if has and u in extras:
                f_, b_, z3 = extras[u]
                cost["F"][c] += f_ + z3
                cost["B"][c] += b_ + z3
                cost["I"][c] += b_ + z3
                ext_f[c] += f_
                ext_b[c] += b_
                blk_f[c] += z3
                blk_b[c] += z3
        cost["F"][c] += send_f
        cost["B"][c] += send_b
        cost["I"][c] += send_b
    ptime: dict = {}
    busy = 0.0
    pair_sum, pairs = 0.0, 0
    # The same additions in the same order as walking the steps (a step's terms: its pair, or
    # each action kind's chunks in order), so the sums are the walk's to the bit.
    for pair, terms in steps:
        if pair is not None:
            t = ptime.get(pair)
            if t is None:
                cf, cb = pair
                t = ptime[pair] = (
                    pair_time(fl[cf], bl[cb], slowdown)
                    + slowdown * (ext_f[cf] + ext_b[cb])
                    + blk_f[cf]
                    + blk_b[cb]
                    + send_f
                    + send_b
                )
            busy += t
            pair_sum += t
            pairs += 1
            continue
        for op, c, n in terms:
            busy += n * cost[op][c]
    return busy, (pair_sum / pairs if pairs else None)


def step_terms(sched_counts) -> tuple:
    """A schedule's steps as ``(pair, terms)``: ``pair`` the ``(forward chunk, backward
    chunk)`` of a step that runs exactly one ``F`` and one ``B`` and nothing else, else
    ``None`` and ``terms`` its ``(action kind, local chunk, count)`` in kind order (F, B, I,
    W), chunks ascending. ``sched_counts``: the ``(F, B, I, W)`` arrays of
    :func:`simulator.studies.search.estimate.schedule_counts`."""
    nF, nB, nI, nW = sched_counts
    pair_step = (nF.sum(axis=1) == 1) & (nB.sum(axis=1) == 1) & ~nI.any(axis=1) & ~nW.any(axis=1)
    cf, cb = nF.argmax(axis=1).tolist(), nB.argmax(axis=1).tolist()
    rows = {op: arr.tolist() for op, arr in zip("FBIW", sched_counts)}
    out = []
    for i, is_pair in enumerate(pair_step.tolist()):
        if is_pair:
            out.append(((cf[i], cb[i]), ()))
        else:
            out.append((None, tuple((op, c, n) for op in "FBIW" for c, n in enumerate(rows[op][i]) if n)))
    return tuple(out)
