package policy

import "testing"

func TestParseSize(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr string
	}{
		{"0", 0, ""},
		{"1048576", 1 << 20, ""},
		{"100B", 100, ""},
		{"512MiB", 512 << 20, ""},
		{"512mib", 512 << 20, ""},
		{"512 MiB", 512 << 20, ""},
		{"512m", 512 << 20, ""},
		{"512M", 512 << 20, ""},
		{"4GiB", 4 << 30, ""},
		{"4g", 4 << 30, ""},
		{"1.5GiB", 3 << 29, ""},
		{"2KiB", 2048, ""},
		{"2k", 2048, ""},
		{"2KB", 2000, ""},
		{"100MB", 100e6, ""},
		{"100mb", 100e6, ""},
		{"1GB", 1e9, ""},
		{"1TiB", 1 << 40, ""},
		{"", 0, `cannot parse size ""`},
		{"MiB", 0, `cannot parse size "MiB"`},
		{"12XB", 0, `cannot parse size "12XB"`},
		{"-1G", 0, `cannot parse size "-1G"`},
		{"1.2.3G", 0, `cannot parse size "1.2.3G"`},
		{"9999999TiB", 0, `size "9999999TiB" is too large`},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		if tt.wantErr != "" {
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("ParseSize(%q) error = %v, want %s", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
}
