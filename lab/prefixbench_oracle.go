package lab

import "strings"

// benchShort names the arms in the every-arm table's header.
var benchShort = map[string]string{
	BenchRandom:        "random",
	BenchLoadOnly:      "load-only",
	BenchSwitchyard:    "Switchyard",
	BenchBigMap:        "large map",
	BenchKVEvents:      "KV events",
	BenchPredicted:     "predicted",
	BenchPredictedFeed: "+ feed",
}

// EveryArmAgainstOracle is the every-arm comparison with the oracle, step
// by step, as a markdown table: the oracle's hit rate and p90 TTFT, the KV
// events arm's hit rate and its difference in points, and each arm's p90
// over the oracle's.
func (r *PrefixBenchResult) EveryArmAgainstOracle() string {
	header := []string{"req/s", "oracle hit", "oracle p90", "KV events hit", "Δ"}
	var arms []string
	for _, a := range r.Arms {
		if a != BenchOracle {
			arms = append(arms, a)
			header = append(header, benchShort[a]+" ×")
		}
	}
	var rows [][]string
	for i, rate := range r.Rates {
		o, k := r.Of(BenchOracle, i), r.Of(BenchKVEvents, i)
		row := []string{f1(rate), pct(o.HitRate), ms(o.P90), pct(k.HitRate), fmtf("%+.1f", 100*(k.HitRate-o.HitRate))}
		for _, a := range arms {
			row = append(row, fmtf("%.2f×", r.GapOf(a, i)))
		}
		rows = append(rows, row)
	}
	return strings.TrimSuffix(mdTable(header, rows), "\n")
}

// fullRunNote gives a quick run's section the full run's every-arm table,
// kept in prefixBenchFullRun (the full run takes several times the quick
// one's time; the quick one is the report's).
func (r *PrefixBenchResult) fullRunNote() string {
	if r.Scale == Full {
		return ""
	}
	return "\n**Every arm against the oracle, full run** (`switchyard lab prefix-bench --workers 1 --out DIR`, seed 1: 90 s\n" +
		"steps from 3 to 24 req/s):\n\n" + prefixBenchFullRun + "\n"
}

// prefixBenchFullRun is the full run's every-arm table, measured with
// seed 1; TestLabPrefixBenchFullRunTableIsCurrent fails when a change makes
// the full run measure anything else.
const prefixBenchFullRun = `| req/s | oracle hit | oracle p90 | KV events hit | Δ | random × | load-only × | Switchyard × | large map × | KV events × | predicted × | + feed × |
|---|---|---|---|---|---|---|---|---|---|---|---|
| 3.0 | 77.1% | 305 | 77.1% | +0.0 | 3.29× | 3.02× | 1.92× | 0.89× | 1.02× | 1.96× | 0.96× |
| 6.0 | 83.0% | 255 | 83.0% | +0.0 | 5.19× | 5.82× | 1.32× | 0.96× | 0.90× | 1.21× | 0.93× |
| 9.0 | 83.2% | 285 | 83.4% | +0.2 | 10.19× | 9.85× | 1.44× | 0.94× | 0.95× | 1.23× | 0.92× |
| 12.0 | 83.2% | 287 | 83.2% | +0.0 | 36.34× | 13.75× | 1.95× | 1.03× | 1.05× | 1.32× | 0.99× |
| 15.0 | 82.9% | 332 | 83.0% | +0.1 | 95.28× | 74.22× | 1.99× | 0.94× | 0.94× | 1.74× | 0.97× |
| 18.0 | 82.9% | 395 | 83.2% | +0.3 | 194.50× | 177.75× | 1.89× | 0.97× | 0.91× | 1.64× | 0.89× |
| 21.0 | 82.8% | 425 | 83.1% | +0.3 | 209.30× | 212.49× | 2.93× | 1.18× | 1.07× | 1.81× | 1.08× |
| 24.0 | 78.2% | 2603 | 82.0% | +3.8 | 34.77× | 34.62× | 1.21× | 1.43× | 0.58× | 1.02× | 0.98× |`
