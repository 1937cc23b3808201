package policy

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// sizeUnits maps lower-cased unit suffixes to byte multipliers. The single
// letters are binary, as in docker's --memory, because that is what people
// who write "512m" expect.
var sizeUnits = map[string]float64{
	"":    1,
	"b":   1,
	"k":   1 << 10,
	"kib": 1 << 10,
	"kb":  1e3,
	"m":   1 << 20,
	"mib": 1 << 20,
	"mb":  1e6,
	"g":   1 << 30,
	"gib": 1 << 30,
	"gb":  1e9,
	"t":   1 << 40,
	"tib": 1 << 40,
	"tb":  1e12,
}

// ParseSize parses a byte size such as "512MiB", "4GiB", "1.5g", "100MB" or
// "1048576". Units are case-insensitive; KiB/MiB/GiB/TiB and k/m/g/t are
// powers of 1024, KB/MB/GB/TB powers of 1000, and no unit means bytes.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := sizeUnits[unit]
	if num == "" || !ok {
		return 0, fmt.Errorf("cannot parse size %q", s)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("cannot parse size %q", s)
	}
	b := math.Round(v * mult)
	// float64(MaxInt64) rounds up to 2^63, so >= rejects exactly the
	// values that would overflow the conversion.
	if b >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return int64(b), nil
}
