//! The Q8_1 quantizer against hand-computed blocks and Q8_0; [`zero`] is shared with the Q4_1
//! tests.

use super::*;
use crate::testutil::Rng;

pub(crate) fn zero() -> BlockQ8_1 {
    BlockQ8_1 {
        d: [0; 2],
        s: [0; 2],
        qs: [0; QK],
    }
}

#[test]
fn quantize_exact_with_ties_and_s() {
    // amax = 127 -> d = 1: quants are the rounded inputs, ties away from zero.
    let mut x = [0.0f32; QK];
    x[0] = -127.0;
    x[1] = 0.5; // -> 1
    x[2] = -1.5; // -> -2
    x[16] = 2.5; // -> 3
    x[17] = 100.25; // -> 100
    let mut y = [zero()];
    quantize_row(&x, &mut y);
    assert_eq!(y[0].d, 0x3C00u16.to_le_bytes());
    let mut want = [0i8; QK];
    want[0] = -127;
    want[1] = 1;
    want[2] = -2;
    want[16] = 3;
    want[17] = 100;
    assert_eq!(y[0].qs, want);
    // s = sum(q) * d = -25 (0xCE40); the input sum would be -25.25.
    assert_eq!(y[0].s(), -25.0);
    assert_eq!(y[0].s, 0xCE40u16.to_le_bytes());
}

#[test]
fn s_uses_f32_d() {
    // amax = 1: d = 1/127 in f32; q = [127, 127, 0...] -> s = f16(254 * (1/127)f32).
    let mut x = [0.0f32; QK];
    x[0] = 1.0;
    x[5] = 1.0;
    let mut y = [zero()];
    quantize_row(&x, &mut y);
    let d32 = 1.0f32 / 127.0;
    assert_eq!(
        u16::from_le_bytes(y[0].s),
        half::f16::from_f32(254.0 * d32).to_bits()
    );
    assert_eq!(y[0].s(), 2.0);
}

#[test]
fn matches_q8_0_quants() {
    let mut r = Rng::new(11);
    let x = r.vec(QK * 5, 7.0);
    let mut a = vec![zero(); 5];
    let mut b = vec![
        crate::cpu::BlockQ8_0 {
            d: [0; 2],
            qs: [0; QK]
        };
        5
    ];
    quantize_row(&x, &mut a);
    crate::cpu::q8_0::quantize_row(&x, &mut b);
    for (a, b) in a.iter().zip(&b) {
        assert_eq!((a.d, a.qs), (b.d, b.qs));
        let sum: i32 = a.qs.iter().map(|&q| i32::from(q)).sum();
        assert!((a.s() - sum as f32 * a.d()).abs() <= 1e-2 * (1.0 + a.s().abs()));
    }
    let mut back = vec![0.0; x.len()];
    dequantize_row(&a, &mut back);
    for (xb, bb) in x.chunks(QK).zip(back.chunks(QK)) {
        let d = amax(xb) / 127.0;
        for (p, q) in xb.iter().zip(bb) {
            assert!((p - q).abs() <= 0.5 * d + 127.0 * d * 2.0f32.powi(-11) + 1e-6);
        }
    }
}
