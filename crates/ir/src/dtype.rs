//! Element types: every ONNX `TensorProto.DataType`, with sizes and the
//! spellings of the ONNX textual syntax.

use std::fmt;

/// An ONNX tensor element type. `Other` keeps codes from a newer ONNX than
/// this build knows, so they survive a round trip.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    Undefined,
    F32,
    U8,
    I8,
    U16,
    I16,
    I32,
    I64,
    String,
    Bool,
    F16,
    F64,
    U32,
    U64,
    Complex64,
    Complex128,
    BF16,
    F8E4M3FN,
    F8E4M3FNUZ,
    F8E5M2,
    F8E5M2FNUZ,
    U4,
    I4,
    F4E2M1,
    F8E8M0,
    U2,
    I2,
    F6E2M3,
    F6E3M2,
    Other(i32),
}

/// `(dtype, onnx code, text name)`, in code order.
const TABLE: &[(DType, i32, &str)] = &[
    (DType::Undefined, 0, "undefined"),
    (DType::F32, 1, "float"),
    (DType::U8, 2, "uint8"),
    (DType::I8, 3, "int8"),
    (DType::U16, 4, "uint16"),
    (DType::I16, 5, "int16"),
    (DType::I32, 6, "int32"),
    (DType::I64, 7, "int64"),
    (DType::String, 8, "string"),
    (DType::Bool, 9, "bool"),
    (DType::F16, 10, "float16"),
    (DType::F64, 11, "double"),
    (DType::U32, 12, "uint32"),
    (DType::U64, 13, "uint64"),
    (DType::Complex64, 14, "complex64"),
    (DType::Complex128, 15, "complex128"),
    (DType::BF16, 16, "bfloat16"),
    (DType::F8E4M3FN, 17, "float8e4m3fn"),
    (DType::F8E4M3FNUZ, 18, "float8e4m3fnuz"),
    (DType::F8E5M2, 19, "float8e5m2"),
    (DType::F8E5M2FNUZ, 20, "float8e5m2fnuz"),
    (DType::U4, 21, "uint4"),
    (DType::I4, 22, "int4"),
    (DType::F4E2M1, 23, "float4e2m1"),
    (DType::F8E8M0, 24, "float8e8m0"),
    (DType::U2, 25, "uint2"),
    (DType::I2, 26, "int2"),
    (DType::F6E2M3, 27, "float6e2m3"),
    (DType::F6E3M2, 28, "float6e3m2"),
];

impl DType {
    /// Every known dtype (excluding `Other`).
    pub fn all() -> impl Iterator<Item = DType> {
        TABLE.iter().map(|t| t.0)
    }

    pub fn from_onnx(code: i32) -> DType {
        TABLE
            .iter()
            .find(|t| t.1 == code)
            .map(|t| t.0)
            .unwrap_or(DType::Other(code))
    }

    pub fn to_onnx(self) -> i32 {
        match self {
            DType::Other(c) => c,
            d => TABLE.iter().find(|t| t.0 == d).map(|t| t.1).unwrap_or(0),
        }
    }

    /// The spelling in the ONNX textual syntax (`float`, `int64`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Other(_) => "unknown",
            d => TABLE
                .iter()
                .find(|t| t.0 == d)
                .map(|t| t.2)
                .unwrap_or("unknown"),
        }
    }

    pub fn from_name(name: &str) -> Option<DType> {
        TABLE.iter().find(|t| t.2 == name).map(|t| t.0)
    }

    /// Bits per element (`None` for strings and unknown codes).
    pub fn bits(self) -> Option<u64> {
        use DType::*;
        Some(match self {
            Bool | U8 | I8 | F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F8E8M0 => 8,
            U16 | I16 | F16 | BF16 => 16,
            F32 | I32 | U32 => 32,
            F64 | I64 | U64 | Complex64 => 64,
            Complex128 => 128,
            U4 | I4 | F4E2M1 => 4,
            U2 | I2 => 2,
            // Packed raw layout of the 6-bit floats is not specified by ONNX
            // yet; they are stored one per byte, as int32_data holds them.
            F6E2M3 | F6E3M2 => 8,
            String | Undefined | Other(_) => return None,
        })
    }

    /// Bytes needed by `numel` elements in ONNX's packed `raw_data` layout.
    pub fn storage_bytes(self, numel: u64) -> Option<u64> {
        let bits = self.bits()?;
        numel.checked_mul(bits).map(|b| b.div_ceil(8))
    }

    pub fn is_float(self) -> bool {
        use DType::*;
        matches!(
            self,
            F32 | F16
                | F64
                | BF16
                | F8E4M3FN
                | F8E4M3FNUZ
                | F8E5M2
                | F8E5M2FNUZ
                | F4E2M1
                | F8E8M0
                | F6E2M3
                | F6E3M2
        )
    }

    pub fn is_int(self) -> bool {
        use DType::*;
        matches!(
            self,
            U8 | I8 | U16 | I16 | I32 | I64 | U32 | U64 | U4 | I4 | U2 | I2
        )
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DType::Other(c) => write!(f, "dtype{c}"),
            d => f.write_str(d.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for d in DType::all() {
            assert_eq!(DType::from_onnx(d.to_onnx()), d);
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(DType::from_onnx(99), DType::Other(99));
        assert_eq!(DType::Other(99).to_onnx(), 99);
    }

    #[test]
    fn packed_sizes() {
        assert_eq!(DType::I4.storage_bytes(3), Some(2));
        assert_eq!(DType::U2.storage_bytes(5), Some(2));
        assert_eq!(DType::F16.storage_bytes(3), Some(6));
        assert_eq!(DType::String.storage_bytes(3), None);
    }
}
