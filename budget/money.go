// Package budget enforces spend budgets: what a request may cost at its
// model's price, the budget periods, and the spend of each budget shared by
// every decider through a JetStream KV bucket (Spender), exactly, whatever
// the number of deciders. Money is counted in integer micro-units of the
// table's currency; amounts are JSON numbers only at the edges.
package budget

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-llm/switchyard/table"
)

// Micro is an amount of money in millionths of the currency unit.
type Micro int64

// MicroPerUnit is how many micro-units make one unit of the currency.
const MicroPerUnit = 1_000_000

// MaxTokens bounds a token count charged at once (4M tokens): within it
// and the table's price bounds no product of a price and a count overflows.
const MaxTokens = 1 << 22

// Amount is m as a number of currency units, as JSON answers carry it.
func (m Micro) Amount() float64 { return float64(m) / MicroPerUnit }

// String is m in currency units with up to six decimals, no trailing zeros.
func (m Micro) String() string {
	var b [24]byte
	return string(m.Append(b[:0]))
}

// Append appends m as String writes it.
func (m Micro) Append(dst []byte) []byte {
	if m < 0 {
		dst = append(dst, '-')
		m = -m
	}
	dst = strconv.AppendInt(dst, int64(m/MicroPerUnit), 10)
	f := int64(m % MicroPerUnit)
	if f == 0 {
		return dst
	}
	dst = append(dst, '.')
	for div := int64(MicroPerUnit / 10); f > 0; div /= 10 {
		dst = append(dst, byte('0'+f/div))
		f %= div
	}
	return dst
}

// Price is a model's price in micro-units per million tokens, and the
// factor batch-priority work pays, in thousandths (1000: full price).
type Price struct {
	Input, CachedInput, Output Micro
	BatchMilli                 int64
}

// Zero reports whether the price charges nothing: such a model is never
// refused for budget.
func (p Price) Zero() bool { return p.Input == 0 && p.CachedInput == 0 && p.Output == 0 }

// Cost is what prompt tokens (of which cached were served from the
// engine's prefix cache) and output tokens cost at p, at batch priority
// when batch: each part rounded up to a whole micro-unit, so nothing served
// is ever charged zero. Counts are clamped to [0, MaxTokens].
func (p Price) Cost(prompt, cached, output int, batch bool) Micro {
	prompt, output = clampTokens(prompt), clampTokens(output)
	cached = min(clampTokens(cached), prompt)
	c := perTokens(p.Input, prompt-cached) + perTokens(p.CachedInput, cached) + perTokens(p.Output, output)
	if batch && p.BatchMilli != 1000 {
		c = Micro((int64(c)*p.BatchMilli + 999) / 1000)
	}
	return c
}

func clampTokens(n int) int { return min(max(n, 0), MaxTokens) }

// perTokens is n tokens at price per million, rounded up.
func perTokens(price Micro, n int) Micro {
	if price <= 0 || n <= 0 {
		return 0
	}
	return Micro((int64(price)*int64(n) + 999_999) / 1_000_000)
}

// Header renders p for the Llm-Price header: four integers.
func (p Price) Header() string {
	return strconv.FormatInt(int64(p.Input), 10) + "," + strconv.FormatInt(int64(p.CachedInput), 10) + "," +
		strconv.FormatInt(int64(p.Output), 10) + "," + strconv.FormatInt(p.BatchMilli, 10)
}

// ParsePriceHeader reads an Llm-Price header; ok is false when it is not
// four non-negative integers within the table's bounds.
func ParsePriceHeader(v string) (p Price, ok bool) {
	var f [4]int64
	for i := range f {
		part := v
		if i < 3 {
			j := strings.IndexByte(v, ',')
			if j < 0 {
				return Price{}, false
			}
			part, v = v[:j], v[j+1:]
		}
		n, err := strconv.ParseInt(part, 10, 64)
		if err != nil || n < 0 {
			return Price{}, false
		}
		f[i] = n
	}
	const most = table.MaxPrice * MicroPerUnit
	if f[0] > most || f[1] > most || f[2] > most || f[3] > table.MaxBatchFactor*1000 {
		return Price{}, false
	}
	return Price{Input: Micro(f[0]), CachedInput: Micro(f[1]), Output: Micro(f[2]), BatchMilli: f[3]}, true
}

// Bounds is the period that holds t: when it began and when it resets (both
// zero for table.PeriodTotal), and its id, which names its spend in the
// bucket. Periods are calendar periods in UTC; weeks begin on Monday.
func Bounds(period string, t time.Time) (start, reset time.Time, id string) {
	t = t.UTC()
	y, m, d := t.Date()
	switch period {
	case table.PeriodDay:
		start = time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 0, 1), "d" + start.Format("20060102")
	case table.PeriodWeek:
		back := (int(t.Weekday()) + 6) % 7 // days since Monday
		start = time.Date(y, m, d-back, 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 0, 7), "w" + start.Format("20060102")
	case table.PeriodMonth:
		start = time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 1, 0), "m" + start.Format("200601")
	}
	return time.Time{}, time.Time{}, "total"
}

// PriceOf is the model's price in micro-units (the zero Price for a model
// without one, or nil). The table validated its amounts.
func PriceOf(m *table.Model) Price {
	if m == nil || m.Price == nil {
		return Price{}
	}
	p := m.Price
	cached := p.Input
	if p.CachedInput != nil {
		cached = *p.CachedInput
	}
	batch := 1.0
	if p.Batch != nil {
		batch = *p.Batch
	}
	return Price{Input: micro(p.Input), CachedInput: micro(cached), Output: micro(p.Output), BatchMilli: int64(math.Round(batch * 1000))}
}

// LimitOf is a budget's limit in micro-units.
func LimitOf(b *table.Budget) Micro { return micro(b.Limit) }

func micro(a float64) Micro { return Micro(math.Round(a * MicroPerUnit)) }
