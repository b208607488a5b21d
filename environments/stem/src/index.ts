export { default } from './stem.ts';
export { stemKeyMetrics, stemMetrics, verifyStem, type StemVerifyResult } from './stem.ts';
export { StemConfig, StemRow } from './schema.ts';
export { extractLetter, GradingMode, type McqaInput, type McqaOptions } from './mcqa.ts';
export { extractQuantity, gradeNumeric, parseQuantity, type NumericGrade, type NumericOptions, type Quantity } from './numeric.ts';
export { parseUnit, type Dimension, type Unit } from './units.ts';
