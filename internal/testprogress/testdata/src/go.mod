module exp

go 1.25
