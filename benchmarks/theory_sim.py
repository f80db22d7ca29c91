#!/usr/bin/env python3
"""
theory_sim.py -- numerical check of the "gradient heat" norm equilibrium
(companion to docs/theory.md, section 5; design material, not service code).

CPU only, synthetic data. ~75 s per seed when a core is free (SIM_THREADS=1),
--quick ~40 s.  Writes theory_sim_results[_quick][_seedN].json to benchmarks/out/.

    SIM_THREADS=1 python -m benchmarks.theory_sim [--quick] [--seed 1]

  World: C concept clusters on the unit sphere in R^d; each cluster owns fixed
  unit-norm "documents" (a frozen document tower).  Query "items" are
    * specific   : relevant documents come from ONE cluster      (K=1)
    * ambiguous  : relevant documents come from K=2 or K=4 clusters
  and each item has a sampling weight w in {1,3,9} (frequency), drawn
  independently of K.  Training = InfoNCE (temperature tau) of the item against
  a sampled positive document, with in-batch + random negative documents.

  Part 1  free embedding table + plain SGD + coupled weight decay (every row,
          every step).  Prediction  r_i^4 = eta H_i / (lam (2 - eta lam)),
          H_i = E_step || r_i grad_i ||^2  (scale-free "gradient heat"),
          H measured (a) along the trajectory, (b) by a frozen probe (fresh
          batches at the final directions, no updates) -- (b) is the
          non-circular test.
  Part 1b same with lazy decay (only rows present in the batch are shrunk):
          frequency should drop out, r^4 = eta h_i / (2 lam), h per presence.
  Part 2a SGD + momentum beta:  r^4 = eta H / (2 lam (1 - beta)).
  Part 2b AdamW:  r^2 = eta U~ / (2 lam), U~ = E || g / (sqrt(v_hat)+eps) ||^2
          (preconditioned raw gradient, no momentum); also the naive version
          with the per-step Adam step energy, and the first-order radial term.
  Part 3  linear encoder z = W x (shared parameters, unit-norm inputs), SGD+wd:
          own heat vs heat received from all updates vs first-order cross-talk.
  Part 4  2-layer ReLU MLP encoder + AdamW, short and long runs: signs of the
          norm-ambiguity / norm-frequency relations.
  Part 5  calibration: P(relevant | cosine, query norm) with Platt vs the
          norm-tempered family  logit = exp(alpha + gamma l)(s - b0 - b1 l),
          l = log(r / median r), MAP on half of the items, tested on the rest;
          isotonic variants; label-free sign probe Spearman(norm, top-10 cos).
  Part 6  few labels: 8..150 labelled items, Platt vs NT with flat / default /
          tight prior / fixed at the prior centre.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import time

import numpy as np
import torch
from scipy import optimize, stats

torch.set_num_threads(int(os.environ.get("SIM_THREADS", "1")))


# ----------------------------------------------------------------------------
# synthetic world
# ----------------------------------------------------------------------------
def normalize(a, axis=-1):
    return a / np.linalg.norm(a, axis=axis, keepdims=True)


class World:
    def __init__(
        self,
        seed=0,
        d=32,
        C=24,
        docs_per=20,
        n_spec=400,
        n_k2=100,
        n_k4=100,
        doc_spread=0.5,
        d_in=64,
        item_noise=0.25,
    ):
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.d, self.C = d, C
        self.centres = normalize(rng.normal(size=(C, d)))
        lab = np.repeat(np.arange(C), docs_per)
        noise = doc_spread * rng.normal(size=(C * docs_per, d)) / math.sqrt(d)
        self.docs = normalize(self.centres[lab] + noise).astype(np.float32)
        self.doc_cluster = lab
        self.docs_of = [np.where(lab == k)[0] for k in range(C)]
        # items
        Ks = [1] * n_spec + [2] * n_k2 + [4] * n_k4
        self.K = np.array(Ks)
        self.N = len(Ks)
        self.sets = [rng.choice(C, size=k, replace=False) for k in Ks]
        self.w = rng.choice([1.0, 3.0, 9.0], size=self.N)
        self.p_item = self.w / self.w.sum()
        # encoder inputs: unit-norm mixture of the item's concept centres plus
        # item-specific noise, pushed through a fixed random map R^d -> R^d_in
        Q = rng.normal(size=(d_in, d)) / math.sqrt(d)
        m = np.stack([normalize(self.centres[s].sum(0)) for s in self.sets])
        m = normalize(m + item_noise * rng.normal(size=m.shape) / math.sqrt(d))
        self.X = normalize(m @ Q.T).astype(np.float32)
        # flat table of each item's relevant documents (clusters have equal size,
        # so uniform-over-union == uniform cluster then uniform document)
        pools = [np.concatenate([self.docs_of[k] for k in s]) for s in self.sets]
        self.pool_len = np.array([len(p) for p in pools])
        self.pool_off = np.concatenate([[0], np.cumsum(self.pool_len)[:-1]])
        self.pool_flat = np.concatenate(pools)
        # relevance matrix item x cluster
        self.rel_cluster = np.zeros((self.N, C), bool)
        for i, s in enumerate(self.sets):
            self.rel_cluster[i, s] = True

    def batch(self, rng, B=64, n_neg=128):
        items = rng.choice(self.N, size=B, p=self.p_item)
        j = (rng.random(B) * self.pool_len[items]).astype(np.int64)
        pos = self.pool_flat[self.pool_off[items] + j]
        neg = rng.integers(0, len(self.docs), size=n_neg)
        cols = np.concatenate([pos, neg])
        return items, cols  # target for row b is column b


def info_nce(z, doc_t, cols, tau):
    """z: (B,d) raw embeddings (scale-invariant loss), returns summed loss."""
    u = z / z.norm(dim=1, keepdim=True)
    logits = u @ doc_t[cols].T / tau
    tgt = torch.arange(z.shape[0])
    return torch.nn.functional.cross_entropy(logits, tgt, reduction="sum")


# ----------------------------------------------------------------------------
# Part 1/2: free embedding table
# ----------------------------------------------------------------------------
def train_free(
    world,
    opt="sgd",
    steps=25000,
    measure=10000,
    eta=0.01,
    lam=0.01,
    beta=0.9,
    tau=0.1,
    B=64,
    seed=1,
    r0=0.5,
    probe=3000,
):
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    N, d = world.N, world.d
    E0 = normalize(rng.normal(size=(N, d))) * r0
    E = torch.nn.Parameter(torch.tensor(E0, dtype=torch.float32))
    doc_t = torch.tensor(world.docs)
    if opt == "sgd":
        o = torch.optim.SGD([E], lr=eta, weight_decay=lam)
    elif opt == "sgd_lazy":  # decay only the rows that were in the batch
        o = torch.optim.SGD([E], lr=eta, weight_decay=0.0)
    elif opt == "sgdm":
        o = torch.optim.SGD([E], lr=eta, weight_decay=lam, momentum=beta)
    elif opt == "adamw":
        o = torch.optim.AdamW([E], lr=eta, weight_decay=lam, betas=(0.9, 0.999))
    else:
        raise ValueError(opt)
    H = np.zeros(N)  # scale-free gradient heat, summed over steps
    U = np.zeros(N)  # Adam: ||step direction||^2 summed
    RAD = np.zeros(N)  # Adam: first-order radial term  z.dz / eta
    UP = np.zeros(N)  # Adam: ||g / (sqrt(v_hat)+eps)||^2, no momentum
    R4 = np.zeros(N)
    R2 = np.zeros(N)
    cnt = np.zeros(N)  # how often each item was in a batch (occurrences)
    pres = np.zeros(N)  # steps in which the item was present at least once
    for t in range(steps + measure):
        items, cols = world.batch(rng, B)
        idx = torch.tensor(items)
        o.zero_grad()
        loss = info_nce(E[idx], doc_t, torch.tensor(cols), tau)
        loss.backward()
        meas = t >= steps
        if meas:
            with torch.no_grad():
                r = E.norm(dim=1)
                g = E.grad
                H += ((g.norm(dim=1) * r) ** 2).numpy()
                np.add.at(cnt, items, 1)
                pres[np.unique(items)] += 1
                before = E.detach().clone()
        o.step()
        if opt == "sgd_lazy":
            with torch.no_grad():
                uniq = torch.tensor(np.unique(items))
                E[uniq] *= 1 - eta * lam
        if meas:
            with torch.no_grad():
                if opt == "adamw":
                    st = o.state[E]
                    stp = float(st["step"])
                    vhat = st["exp_avg_sq"] / (1 - 0.999**stp)
                    pg = E.grad / (vhat.sqrt() + 1e-8)
                    UP += (pg.norm(dim=1) ** 2).numpy()
                    step = E.detach() - (1 - eta * lam) * before
                    U += (step.norm(dim=1) ** 2).numpy() / eta**2
                    RAD += ((before * step).sum(1)).numpy() / eta
                rr = E.detach().norm(dim=1).numpy()
                R4 += rr**4
                R2 += rr**2
    H /= measure
    UP /= measure
    U /= measure
    RAD /= measure
    R4 /= measure
    R2 /= measure
    out = {
        "H": H,
        "U": U,
        "UP": UP,
        "RAD": RAD,
        "R4": R4,
        "R2": R2,
        "cnt": cnt / measure,
        "pres": pres / measure,
        "norm": E.detach().norm(dim=1).numpy(),
        "E": E.detach().numpy(),
    }
    # frozen probe: heat from fresh batches evaluated at the final directions
    if probe and opt in ("sgd", "sgdm", "sgd_lazy"):
        Hp = np.zeros(N)
        Ef = torch.nn.Parameter(E.detach().clone())
        for _ in range(probe):
            items, cols = world.batch(rng, B)
            if Ef.grad is not None:
                Ef.grad.zero_()
            loss = info_nce(Ef[torch.tensor(items)], doc_t, torch.tensor(cols), tau)
            loss.backward()
            with torch.no_grad():
                Hp += ((Ef.grad.norm(dim=1) * Ef.norm(dim=1)) ** 2).numpy()
        out["H_probe"] = Hp / probe
    return out


# ----------------------------------------------------------------------------
# Part 3: linear encoder, received heat
# ----------------------------------------------------------------------------
def train_linear(
    world, steps=25000, measure=10000, eta=0.01, lam=0.01, tau=0.1, B=64, seed=2, w0=0.5
):
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    d, din = world.d, world.X.shape[1]
    W = torch.nn.Parameter(
        torch.tensor(
            rng.normal(size=(d, din)) * w0 / math.sqrt(din), dtype=torch.float32
        )
    )
    X = torch.tensor(world.X)
    doc_t = torch.tensor(world.docs)
    o = torch.optim.SGD([W], lr=eta, weight_decay=lam)
    N = world.N
    Hrecv = np.zeros(N)  # scale-free heat received: ||dz_i||^2 r_i^2 / eta^2
    Hown = np.zeros(N)  # scale-free own-gradient heat ||G_i||^2 (x_i unit)
    RAD = np.zeros(N)  # first-order radial term  z_i . dz_i / eta  (scaled by r^2)
    R4 = np.zeros(N)
    for t in range(steps + measure):
        items, cols = world.batch(rng, B)
        o.zero_grad()
        zb = X[torch.tensor(items)] @ W.T
        zb.retain_grad()
        loss = info_nce(zb, doc_t, torch.tensor(cols), tau)
        loss.backward()
        if t >= steps:
            with torch.no_grad():
                Zall = X @ W.T
                r = Zall.norm(dim=1)
                dZ = -eta * (X @ W.grad.T)  # displacement of every item
                Hrecv += ((dZ.norm(dim=1) * r) ** 2).numpy() / eta**2
                RAD += ((Zall * dZ).sum(1) * r**2).numpy() / eta**2
                gz = zb.grad.norm(dim=1) * zb.norm(dim=1)
                np.add.at(Hown, items, (gz**2).numpy())
        o.step()
        if t >= steps:
            with torch.no_grad():
                R4 += ((X @ W.T).norm(dim=1) ** 4).numpy()
    Hrecv /= measure
    Hown /= measure
    RAD /= measure
    R4 /= measure
    with torch.no_grad():
        Z = (X @ W.T).numpy()
    return {
        "Hrecv": Hrecv,
        "Hown": Hown,
        "RAD": RAD,
        "R4": R4,
        "norm": np.linalg.norm(Z, axis=1),
        "E": Z,
    }


# ----------------------------------------------------------------------------
# Part 4: MLP encoder + AdamW
# ----------------------------------------------------------------------------
def train_mlp(world, steps=3000, eta=1e-3, lam=0.05, tau=0.1, B=64, seed=3, hidden=128):
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    din, d = world.X.shape[1], world.d
    net = torch.nn.Sequential(
        torch.nn.Linear(din, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, d)
    )
    X = torch.tensor(world.X)
    doc_t = torch.tensor(world.docs)
    o = torch.optim.AdamW(net.parameters(), lr=eta, weight_decay=lam)
    for _t in range(steps):
        items, cols = world.batch(rng, B)
        o.zero_grad()
        loss = info_nce(net(X[torch.tensor(items)]), doc_t, torch.tensor(cols), tau)
        loss.backward()
        o.step()
    with torch.no_grad():
        Z = net(X).numpy()
    return {"norm": np.linalg.norm(Z, axis=1), "E": Z}


# ----------------------------------------------------------------------------
# analysis helpers
# ----------------------------------------------------------------------------
def loglog(pred, actual):
    lp, la = np.log(pred), np.log(actual)
    slope, _icpt, rv, _, _ = stats.linregress(lp, la)
    return {
        "pearson_log": float(rv),
        "spearman": float(stats.spearmanr(pred, actual)[0]),
        "slope_loglog": float(slope),
        "median_ratio": float(np.median(actual / pred)),
    }


def semantics(world, norm):
    """mean norm by ambiguity K and frequency weight; regression of log r."""
    res = {}
    for k in (1, 2, 4):
        res[f"mean_norm_K{k}"] = float(norm[world.K == k].mean())
    for w in (1.0, 3.0, 9.0):
        res[f"mean_norm_w{int(w)}"] = float(norm[world.w == w].mean())
    # log r = c + a log w + b1 [K=2] + b2 [K=4]
    A = np.column_stack(
        [
            np.ones(world.N),
            np.log(world.w),
            (world.K == 2).astype(float),
            (world.K == 4).astype(float),
        ]
    )
    coef, *_ = np.linalg.lstsq(A, np.log(norm), rcond=None)
    res["dlogr_dlogw"] = float(coef[1])
    res["dlogr_K2_vs_K1"] = float(coef[2])
    res["dlogr_K4_vs_K1"] = float(coef[3])
    res["spearman_norm_vs_K"] = float(stats.spearmanr(norm, world.K)[0])
    return res


# ----------------------------- calibration ----------------------------------
def make_pairs(world, E, rng, n_rel=10, n_rand=30):
    U = normalize(E)
    rows = []
    for i in range(world.N):
        rel_docs = np.concatenate([world.docs_of[k] for k in world.sets[i]])
        a = rng.choice(rel_docs, size=n_rel, replace=False)
        b = rng.integers(0, len(world.docs), size=n_rand)
        for j in np.concatenate([a, b]):
            rows.append((i, j))
    rows = np.array(rows)
    s = np.sum(U[rows[:, 0]] * world.docs[rows[:, 1]], axis=1)
    y = world.rel_cluster[rows[:, 0], world.doc_cluster[rows[:, 1]]].astype(float)
    return rows[:, 0], s, y


def softplus(z):
    return np.logaddexp(0.0, z)


def fit_platt(s, y):
    def f(th):
        a, b = th
        z = a * (s - b)
        p = 1 / (1 + np.exp(-z))
        nll = np.sum(softplus(z) - y * z)
        dz = p - y
        return nll, np.array([np.sum(dz * (s - b)), -np.sum(dz * a)])

    r = optimize.minimize(f, x0=[10.0, 0.3], jac=True, method="L-BFGS-B")
    return r.x


def fit_nt(s, ell, y, gamma0=0.0, sd_gamma=3.0, sd_b1=0.5, init=None):
    """MAP fit of logit = exp(alpha + gamma*l) * (s - b0 - b1*l).
    Gaussian priors: gamma ~ N(gamma0, sd_gamma^2), b1 ~ N(0, sd_b1^2),
    alpha, b0 ~ N(init, 10^2) (weak)."""
    a_p, b_p = init if init is not None else fit_platt(s, y)
    alpha0 = math.log(max(a_p, 1e-3))

    def f(th):
        alpha, gamma, b0, b1 = th
        a = np.exp(alpha + gamma * ell)
        c = s - b0 - b1 * ell
        z = a * c
        p = 1 / (1 + np.exp(-z))
        dz = p - y
        nll = np.sum(softplus(z) - y * z)
        nll += 0.5 * ((gamma - gamma0) / sd_gamma) ** 2 + 0.5 * (b1 / sd_b1) ** 2
        nll += 0.5 * ((alpha - alpha0) / 10) ** 2 + 0.5 * ((b0 - b_p) / 10) ** 2
        g = np.array(
            [
                np.sum(dz * z),
                np.sum(dz * z * ell),
                -np.sum(dz * a),
                -np.sum(dz * a * ell),
            ]
        )
        g += np.array(
            [
                (alpha - alpha0) / 100,
                (gamma - gamma0) / sd_gamma**2,
                (b0 - b_p) / 100,
                b1 / sd_b1**2,
            ]
        )
        return nll, g

    r = optimize.minimize(f, x0=[alpha0, gamma0, b_p, 0.0], jac=True, method="L-BFGS-B")
    # Laplace: numerical Hessian for the sd of gamma
    th = r.x
    eps = 1e-4
    Hm = np.zeros((4, 4))
    for k in range(4):
        e = np.zeros(4)
        e[k] = eps
        Hm[:, k] = (f(th + e)[1] - f(th - e)[1]) / (2 * eps)
    try:
        cov = np.linalg.inv(0.5 * (Hm + Hm.T))
        sd = np.sqrt(np.maximum(np.diag(cov), 0))
    except np.linalg.LinAlgError:
        sd = np.full(4, np.nan)
    return th, sd


def nt_prob(th, s, ell):
    alpha, gamma, b0, b1 = th
    z = np.exp(alpha + gamma * ell) * (s - b0 - b1 * ell)
    return 1 / (1 + np.exp(-z))


def metrics(p, y, bins=15):
    p = np.clip(p, 1e-7, 1 - 1e-7)
    nll = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    brier = float(np.mean((p - y) ** 2))
    edges = np.linspace(0, 1, bins + 1)
    ece = 0.0
    for lo, hi in itertools.pairwise(edges):
        m = (p >= lo) & (p < hi) if hi < 1 else (p >= lo)
        if m.any():
            ece += m.mean() * abs(p[m].mean() - y[m].mean())
    return {"nll": nll, "brier": brier, "ece": float(ece)}


def isotonic_on(z_tr, y_tr, z_te):
    order = np.argsort(z_tr)
    fit = optimize.isotonic_regression(y_tr[order]).x
    fit = np.clip(fit, 1e-4, 1 - 1e-4)
    return np.interp(z_te, z_tr[order], fit)


def calibration(world, E, seed=11):
    rng = np.random.default_rng(seed)
    item, s, y = make_pairs(world, E, rng)
    norms = np.linalg.norm(E, axis=1)
    l_item = np.log(norms / np.median(norms))
    ell = l_item[item]
    perm = rng.permutation(world.N)
    tr_items = np.zeros(world.N, bool)
    tr_items[perm[: world.N // 2]] = True
    tr, te = tr_items[item], ~tr_items[item]
    a, b = fit_platt(s[tr], y[tr])
    p_platt = 1 / (1 + np.exp(-a * (s[te] - b)))
    th, sd = fit_nt(s[tr], ell[tr], y[tr], init=(a, b))
    p_nt = nt_prob(th, s[te], ell[te])
    # isotonic corrections (fit on train split only)
    p_iso_s = isotonic_on(s[tr], y[tr], s[te])
    z_tr = np.exp(th[0] + th[1] * ell[tr]) * (s[tr] - th[2] - th[3] * ell[tr])
    z_te = np.exp(th[0] + th[1] * ell[te]) * (s[te] - th[2] - th[3] * ell[te])
    p_iso_nt = isotonic_on(z_tr, y[tr], z_te)
    # label-free sign probe: does a long query sit in a tight neighbourhood?
    U = normalize(E)
    top10 = np.sort(U @ world.docs.T, axis=1)[:, -10:].mean(1)
    probe = float(stats.spearmanr(norms, top10)[0])
    return {
        "platt": dict(a=float(a), b=float(b), **metrics(p_platt, y[te])),
        "norm_tempered": dict(
            alpha=float(th[0]),
            gamma=float(th[1]),
            gamma_sd=float(sd[1]),
            b0=float(th[2]),
            b1=float(th[3]),
            **metrics(p_nt, y[te]),
        ),
        "isotonic_on_cosine": metrics(p_iso_s, y[te]),
        "isotonic_on_nt_logit": metrics(p_iso_nt, y[te]),
        "sign_probe_spearman_norm_top10cos": probe,
        "norm_cv": float(np.std(norms) / np.mean(norms)),
    }


def few_labels(world, E, n_items=(8, 16, 32, 64, 150), reps=30, seed=21, gamma0=0.5):
    """Test NLL when only n_items labelled queries (x40 pairs each) are
    available: Platt vs norm-tempered with (a) flat prior, (b) default prior
    gamma~N(gamma0,1), b1~N(0,0.5^2), (c) tight prior gamma~N(gamma0,0.3^2),
    b1~N(0,0.1^2), (d) gamma, b1 fixed at the prior centre (only alpha, b0 fitted)."""
    rng = np.random.default_rng(seed)
    item, s, y = make_pairs(world, E, rng)
    norms = np.linalg.norm(E, axis=1)
    ell = np.log(norms / np.median(norms))[item]
    out = {}
    for n in n_items:
        acc = {
            "platt": [],
            "nt_flat": [],
            "nt_prior": [],
            "nt_tight": [],
            "nt_fixed": [],
        }
        for _ in range(reps):
            perm = rng.permutation(world.N)
            tr_set = np.zeros(world.N, bool)
            tr_set[perm[:n]] = True
            te_set = np.zeros(world.N, bool)
            te_set[perm[world.N // 2 :]] = True
            tr, te = tr_set[item], te_set[item]
            if y[tr].sum() < 2:
                continue
            a, b = fit_platt(s[tr], y[tr])
            acc["platt"].append(
                metrics(1 / (1 + np.exp(-a * (s[te] - b))), y[te])["nll"]
            )
            th, _ = fit_nt(
                s[tr],
                ell[tr],
                y[tr],
                gamma0=0.0,
                sd_gamma=100.0,
                sd_b1=100.0,
                init=(a, b),
            )
            acc["nt_flat"].append(metrics(nt_prob(th, s[te], ell[te]), y[te])["nll"])
            th, _ = fit_nt(
                s[tr],
                ell[tr],
                y[tr],
                gamma0=gamma0,
                sd_gamma=1.0,
                sd_b1=0.5,
                init=(a, b),
            )
            acc["nt_prior"].append(metrics(nt_prob(th, s[te], ell[te]), y[te])["nll"])
            th, _ = fit_nt(
                s[tr],
                ell[tr],
                y[tr],
                gamma0=gamma0,
                sd_gamma=0.3,
                sd_b1=0.1,
                init=(a, b),
            )
            acc["nt_tight"].append(metrics(nt_prob(th, s[te], ell[te]), y[te])["nll"])
            th, _ = fit_nt(
                s[tr],
                ell[tr],
                y[tr],
                gamma0=gamma0,
                sd_gamma=1e-3,
                sd_b1=1e-3,
                init=(a, b),
            )
            acc["nt_fixed"].append(metrics(nt_prob(th, s[te], ell[te]), y[te])["nll"])
        out[f"n_items_{n}"] = {k: float(np.mean(v)) for k, v in acc.items()}
        out[f"n_items_{n}"].update(
            {k + "_median": float(np.median(v)) for k, v in acc.items()}
        )
        out[f"n_items_{n}"]["n_pairs"] = int(n * 40)
    return out


# ----------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    q = args.quick
    S, M = (6000, 3000) if q else (25000, 10000)
    world = World(seed=args.seed)
    R = {
        "config": {
            "quick": q,
            "steps": S,
            "measure": M,
            "N": world.N,
            "d": world.d,
            "C": world.C,
        }
    }
    t0 = time.time()

    # ---- Part 1: SGD free table
    eta, lam = 0.01, 0.01
    o = train_free(world, "sgd", S, M, eta=eta, lam=lam, probe=1000 if q else 3000)
    pred_traj = (eta * o["H"] / (lam * (2 - eta * lam))) ** 0.25
    pred_probe = (eta * o["H_probe"] / (lam * (2 - eta * lam))) ** 0.25
    R["part1_sgd"] = {
        "traj": loglog(pred_traj, o["R4"] ** 0.25),
        "probe_vs_final": loglog(pred_probe, o["norm"]),
        "semantics": semantics(world, o["norm"]),
        "heat_by_K": {
            f"K{k}": float(o["H_probe"][world.K == k].mean()) for k in (1, 2, 4)
        },
        "angular_step_rms": float(np.sqrt(np.mean(eta**2 * o["H"] / o["R4"]))),
        "angular_step_theory": float(math.sqrt(2 * eta * lam)),
    }
    E_sgd = o["E"]
    print(f"[part1] done {time.time() - t0:.0f}s", flush=True)

    # ---- Part 1b: SGD with lazy (sparse) decay: frequency should drop out
    lam_lazy = 0.1
    o = train_free(world, "sgd_lazy", S, M, eta=eta, lam=lam_lazy, probe=0, seed=7)
    h_per_presence = o["H"] / np.maximum(o["pres"], 1e-9)
    pred = (eta * h_per_presence / (lam_lazy * (2 - eta * lam_lazy))) ** 0.25
    R["part1b_sgd_lazy_decay"] = {
        "traj": loglog(pred, o["R4"] ** 0.25),
        "semantics": semantics(world, o["norm"]),
    }
    print(f"[part1b] done {time.time() - t0:.0f}s", flush=True)

    # ---- Part 2a: SGD + momentum
    beta = 0.9
    eta_m = 0.001
    o = train_free(
        world,
        "sgdm",
        S,
        M,
        eta=eta_m,
        lam=lam,
        beta=beta,
        probe=1000 if q else 3000,
        seed=4,
    )
    pred = (eta_m * o["H"] / (2 * lam * (1 - beta))) ** 0.25
    predp = (eta_m * o["H_probe"] / (2 * lam * (1 - beta))) ** 0.25
    R["part2_sgd_momentum"] = {
        "traj": loglog(pred, o["R4"] ** 0.25),
        "probe_vs_final": loglog(predp, o["norm"]),
        "semantics": semantics(world, o["norm"]),
    }
    print(f"[part2a] done {time.time() - t0:.0f}s", flush=True)

    # ---- Part 2b: AdamW
    eta_a, lam_a = 2e-3, 0.05
    o = train_free(world, "adamw", S, M, eta=eta_a, lam=lam_a, probe=0, seed=5)
    predU = np.sqrt(eta_a * o["U"] / (lam_a * (2 - eta_a * lam_a)))
    predU_rad = np.sqrt(
        eta_a * (o["U"] + 2 * o["RAD"] / eta_a) / (lam_a * (2 - eta_a * lam_a))
    )
    predUP = np.sqrt(eta_a * o["UP"] / (lam_a * (2 - eta_a * lam_a)))
    R["part2_adamw"] = {
        "preconditioned_heat": loglog(predUP, np.sqrt(o["R2"])),
        "universal_sqrt_eta_d_over_2lam": float(
            math.sqrt(eta_a * world.d / (2 * lam_a))
        ),
        "mean_norm": float(np.mean(o["norm"])),
        "heat_only": loglog(predU, np.sqrt(o["R2"])),
        "with_first_order_radial": loglog(
            np.maximum(predU_rad, 1e-6), np.sqrt(o["R2"])
        ),
        "radial_share": float(np.mean(2 * o["RAD"] / eta_a) / np.mean(o["U"])),
        "U_by_K": {f"K{k}": float(o["U"][world.K == k].mean()) for k in (1, 2, 4)},
        "UP_by_K": {f"K{k}": float(o["UP"][world.K == k].mean()) for k in (1, 2, 4)},
        "semantics": semantics(world, o["norm"]),
    }
    E_adam = o["E"]
    print(f"[part2b] done {time.time() - t0:.0f}s", flush=True)

    # ---- Part 3: linear encoder
    o = train_linear(world, S, M, eta=eta, lam=lam)
    pred_recv = (eta * o["Hrecv"] / (lam * (2 - eta * lam))) ** 0.25
    pred_own = (eta * np.maximum(o["Hown"], 1e-12) / (lam * (2 - eta * lam))) ** 0.25
    tot = o["Hrecv"] + 2 * o["RAD"]
    pred_tot = (eta * np.maximum(tot, 1e-12) / (lam * (2 - eta * lam))) ** 0.25
    R["part3_linear_encoder"] = {
        "own_heat": loglog(pred_own, o["R4"] ** 0.25),
        "received_heat": loglog(pred_recv, o["R4"] ** 0.25),
        "received_plus_radial": loglog(pred_tot, o["R4"] ** 0.25),
        "radial_share": float(np.mean(2 * o["RAD"]) / np.mean(o["Hrecv"])),
        "heat_received_by_K": {
            f"K{k}": float(o["Hrecv"][world.K == k].mean()) for k in (1, 2, 4)
        },
        "radial_first_order_by_K": {
            f"K{k}": float(2 * o["RAD"][world.K == k].mean()) for k in (1, 2, 4)
        },
        "semantics": semantics(world, o["norm"]),
    }
    E_lin = o["E"]
    print(f"[part3] done {time.time() - t0:.0f}s", flush=True)

    # ---- Part 4: MLP + AdamW, transient and long
    o_s = train_mlp(world, steps=1500 if q else 3000)
    o_l = train_mlp(world, steps=S + M, seed=6)
    R["part4_mlp_adamw"] = {
        "short": semantics(world, o_s["norm"]),
        "long": semantics(world, o_l["norm"]),
    }
    print(f"[part4] done {time.time() - t0:.0f}s", flush=True)

    # ---- Part 5: calibration
    R["part5_calibration"] = {
        "free_sgd": calibration(world, E_sgd),
        "free_adamw": calibration(world, E_adam),
        "linear_encoder_sgd": calibration(world, E_lin),
        "mlp_adamw_short": calibration(world, o_s["E"]),
        "mlp_adamw_long": calibration(world, o_l["E"]),
    }
    # ---- Part 6: few labels -- does the prior help?
    R["part6_few_labels"] = {
        "mlp_adamw_long": few_labels(world, o_l["E"], reps=10 if q else 30),
        "free_sgd": few_labels(world, E_sgd, reps=10 if q else 30, gamma0=0.0),
    }
    R["runtime_s"] = time.time() - t0
    tag = ("_quick" if q else "") + (f"_seed{args.seed}" if args.seed else "")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"theory_sim_results{tag}.json")
    with open(path, "w") as f:
        json.dump(R, f, indent=1)
    print(json.dumps(R, indent=1))


if __name__ == "__main__":
    main()
