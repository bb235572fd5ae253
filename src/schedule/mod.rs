//! StragglAR and baseline schedules, the replay verifier and the alpha-beta cost model.
//! Pure: std only, no FFI, no global state.
