//! ggml's NEON order in scalar code (see the module docs of `neon.rs`), for the tests.

use super::*;

/// ggml's 4 integer lanes of one block: lane `k` = elements `4k..4k+3` and `16+4k..16+4k+3`.
fn lanes(w: impl Fn(usize) -> i32, x: &[i8; 32]) -> [i32; 4] {
    let mut l = [0i32; 4];
    for (j, xj) in x.iter().enumerate() {
        l[(j % 16) / 4] += w(j) * i32::from(*xj);
    }
    l
}

fn mla(acc: &mut [f32; 4], l: [i32; 4], scale: f32) {
    for (a, v) in acc.iter_mut().zip(l) {
        *a = if FUSED {
            (v as f32).mul_add(scale, *a)
        } else {
            *a + v as f32 * scale
        };
    }
}

fn hsum(a: [f32; 4]) -> f32 {
    (a[0] + a[1]) + (a[2] + a[3])
}

fn nib(qs: &[u8; 16], j: usize) -> i32 {
    i32::from(if j < 16 {
        qs[j] & 0x0F
    } else {
        qs[j - 16] >> 4
    })
}

pub(crate) fn dot_q4_1(w: &[BlockQ4_1], x: &[BlockQ8_1]) -> f32 {
    let nb = w.len();
    let (mut acc, mut summs) = ([[0.0f32; 4]; 2], 0.0f32);
    let mut ib = 0;
    while ib + 1 < nb {
        summs += fmadd(w[ib].m(), x[ib].s(), w[ib + 1].m() * x[ib + 1].s());
        for k in 0..2 {
            let (bw, bx) = (&w[ib + k], &x[ib + k]);
            mla(
                &mut acc[k],
                lanes(|j| nib(&bw.qs, j), &bx.qs),
                bw.d() * bx.d(),
            );
        }
        ib += 2;
    }
    let mut sumf = hsum(acc[0]) + hsum(acc[1]) + summs;
    if ib < nb {
        let sumi: i32 = lanes(|j| nib(&w[ib].qs, j), &x[ib].qs).iter().sum();
        sumf += fmadd(w[ib].d() * x[ib].d(), sumi as f32, w[ib].m() * x[ib].s());
    }
    sumf
}

pub(crate) fn dot_q4_0(w: &[BlockQ4_0], x: &[BlockQ8_0]) -> f32 {
    let nb = w.len();
    let mut acc = [[0.0f32; 4]; 2];
    let mut ib = 0;
    while ib + 1 < nb {
        for k in 0..2 {
            let (bw, bx) = (&w[ib + k], &x[ib + k]);
            mla(
                &mut acc[k],
                lanes(|j| nib(&bw.qs, j) - 8, &bx.qs),
                bw.d() * bx.d(),
            );
        }
        ib += 2;
    }
    let mut sumf = hsum(acc[0]) + hsum(acc[1]);
    if ib < nb {
        let sumi: i32 = lanes(|j| nib(&w[ib].qs, j) - 8, &x[ib].qs).iter().sum();
        sumf = fmadd(sumi as f32 * w[ib].d(), x[ib].d(), sumf);
    }
    sumf
}

pub(crate) fn dot_q8_0(w: &[BlockQ8_0], x: &[BlockQ8_0]) -> f32 {
    let nb = w.len();
    let mut acc = [[0.0f32; 4]; 2];
    let mut ib = 0;
    while ib + 1 < nb {
        for k in 0..2 {
            let (bw, bx) = (&w[ib + k], &x[ib + k]);
            mla(
                &mut acc[k],
                lanes(|j| i32::from(bw.qs[j]), &bx.qs),
                bw.d() * bx.d(),
            );
        }
        ib += 2;
    }
    let mut sumf = hsum(acc[0]) + hsum(acc[1]);
    if ib < nb {
        let sumi: i32 = lanes(|j| i32::from(w[ib].qs[j]), &x[ib].qs).iter().sum();
        sumf = fmadd(sumi as f32, w[ib].d() * x[ib].d(), sumf);
    }
    sumf
}
